"""Loading typed configuration: TOML file, then environment overrides, then pydantic validation."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adx.errors import InvalidInputError

__all__ = ["ConfigError", "LoggingConfig", "StrictModel", "load_model"]

ENV_PREFIX = "ADX_"
ENV_NESTING = "__"

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every configuration model: unknown keys are errors (a typo must never be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LoggingConfig(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="the least severe level logged"
    )
    format: Literal["kv", "json"] = Field(default="kv", description="kv: key=value pairs; json: one object a line")


class ConfigError(InvalidInputError):
    """A configuration file or override is invalid. ``field`` is the dotted key path."""

    code = "invalid_config"

    def __init__(self, source: str, field: str, reason: str) -> None:
        self.source = source
        super().__init__(field, reason, details={"source": source})
        self.message = f"{source}: {field}: {reason}" if field else f"{source}: {reason}"

    def __str__(self) -> str:
        return self.message


def join_targets(value: object) -> object:
    """A TOML list of addresses becomes one string ``"a:1,b:2"`` (still a plain string, so a single address
    keeps working wherever one ``host:port`` was expected; ``adx._coordinator_channel`` splits it)."""
    if isinstance(value, list | tuple):
        return ",".join(str(item).strip() for item in value)
    return value


def _parse_env_value(raw: str) -> Any:
    # JSON covers numbers, booleans, lists and objects; anything else is a plain string.
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _apply_env_overrides(data: dict[str, Any], component: str, environ: Mapping[str, str]) -> list[str]:
    """Overlay ``ADX_<COMPONENT>__<KEY>__<SUBKEY>=value`` variables onto ``data``; return what was applied."""
    prefix = f"{ENV_PREFIX}{component.upper().replace('-', '_')}{ENV_NESTING}"
    applied = []
    for name, raw in sorted(environ.items()):
        if not name.startswith(prefix):
            continue
        path = [part.lower() for part in name[len(prefix) :].split(ENV_NESTING)]
        if not all(path):
            raise ConfigError(f"environment variable {name}", "", "empty key segment")
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment variable {name}", ".".join(path), "parent key is not a table")
            node = child
        node[path[-1]] = _parse_env_value(raw)
        applied.append(name)
    return applied


def _format_location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _first_error(exc: ValidationError) -> tuple[str, str]:
    err = exc.errors()[0]
    reason = err["msg"]
    if err["type"] == "extra_forbidden":
        reason = "unknown key"
    return _format_location(tuple(err["loc"])), reason


def load_model(
    model: type[M],
    component: str,
    path: Path | None,
    environ: Mapping[str, str] | None = None,
) -> M:
    """Read ``path`` (optional), apply environment overrides for ``component``, validate into ``model``.

    Raises :class:`ConfigError` naming the key path and the reason.
    """
    source = str(path) if path is not None else "<defaults>"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(source, "", "file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(source, "", f"invalid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(source, "", f"cannot read: {exc.strerror}") from None
    _apply_env_overrides(data, component, os.environ if environ is None else environ)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        field, reason = _first_error(exc)
        raise ConfigError(source, field, reason) from None
