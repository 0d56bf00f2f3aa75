"""The configuration reference (``adx config reference``, ``docs/configuration.md``), made from the typed models.

One fact in one place: every key, type, default, bound and description comes from the component's pydantic
model, so the page cannot drift from what ``adx config check`` accepts (``tests/config`` keeps the checked-in
page equal to this output).
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from adx.cli._components import COMPONENTS, component_model
from adx.config._base import ENV_NESTING, ENV_PREFIX

__all__ = ["configuration_reference"]

_INTRO = """\
# Configuration reference

Every ADX component reads one TOML file (`--config FILE`) validated into a typed model: unknown keys are
errors, and an invalid file stops the command before anything starts, naming the key. Any key can be
overridden from the environment as `ADX_<COMPONENT>__<KEY>__<SUBKEY>=value` (values parse as JSON when they
can, otherwise they are strings). `adx config check FILE --component NAME [--show]` validates a file and
shows the effective configuration.

This page is generated from the models (`adx config reference > docs/configuration.md`); a test keeps it
current. Tables (`[name]`) are nested models; a key with variants (`kind = ...`) lists each variant's keys.
"""


def configuration_reference(components: list[str] | None = None) -> str:
    """The Markdown reference of ``components`` (default: every component, in ``COMPONENTS`` order)."""
    names = components if components is not None else list(COMPONENTS)
    parts = [_INTRO]
    for name in names:
        model = component_model(name)
        parts.append(f"\n## `{name}`\n")
        doc = _first_paragraph(model)
        if doc:
            parts.append(f"\n{doc}\n")
        parts.append(f"\nModel `{model.__module__}.{model.__qualname__}`; environment prefix `{_env(name)}`.\n")
        parts.extend(_tables(model, name, ()))
    return "".join(parts)


def _env(component: str, path: tuple[str, ...] = ()) -> str:
    head = f"{ENV_PREFIX}{component.upper().replace('-', '_')}{ENV_NESTING}"
    return head + ENV_NESTING.join(part.upper() for part in path) + ("" if path else "...")


def _first_paragraph(model: type[BaseModel]) -> str:
    doc = model.__doc__ or ""
    if doc.startswith(BaseModel.__doc__ or "\0"):
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _tables(model: type[BaseModel], component: str, path: tuple[str, ...], variant: str = "") -> Iterator[str]:
    """The table of ``model``'s own keys at ``path``, then one table per nested model, depth first."""
    nested: list[tuple[str, list[type[BaseModel]]]] = []
    rows = []
    for key, field in model.model_fields.items():
        models = _models_in(field.annotation)
        if models:
            nested.append((key, models))
            continue
        rows.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {_escape(_describe(field))} |")
    if path:
        doc = _first_paragraph(model)
        yield f"\n### `[{'.'.join(path)}]`{variant}\n\n" + (f"{doc}\n\n" if doc else "")
    if rows:
        yield "\n" if not path else ""
        yield "| key | type | default | description |\n|---|---|---|---|\n"
        yield "\n".join(rows) + "\n"
    for key, models in nested:
        field = model.model_fields[key]
        for sub in models:
            tag = _variant_tag(sub) if len(models) > 1 or _variant_tag(sub) else ""
            yield from _tables(sub, component, (*path, key), tag)
        if field.description:
            yield f"\n`{key}`: {_escape(field.description)}.\n"
        if _optional(field.annotation):
            yield f"\n`[{'.'.join((*path, key))}]` may be left out (default: {_default(field)}).\n"


def _variant_tag(model: type[BaseModel]) -> str:
    kind = model.model_fields.get("kind")
    if kind is None or kind.default is PydanticUndefined:
        return ""
    return f" with `kind = {_literal(kind.default)}`"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds (a model, an optional model, or a union of models); [] for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        found = [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
        plain = [a for a in typing.get_args(annotation) if a is not type(None) and not _models_in(a)]
        return [] if plain else found
    return []


def _optional(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _optional(typing.get_args(annotation)[0])
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in args)
    if origin is typing.Literal:
        return " \\| ".join(_literal(arg) for arg in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {_type_name(args[1])}" if args else "table"
    if annotation is type(None):
        return "none"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(_literal(member.value) for member in annotation)
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "see table"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, dict | list | tuple):
        return "empty" if not value else f"`{value}`"
    if value == "":
        return '`""`'
    return f"`{_literal(value)}`"


def _describe(field: FieldInfo) -> str:
    text = field.description or ""
    bounds = []
    for meta in field.metadata:
        for attr, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            bound = getattr(meta, attr, None)
            if bound is not None and isinstance(meta, annotated_types.BaseMetadata):
                bounds.append(f"{symbol} {bound}")
        pattern = getattr(meta, "pattern", None)
        if pattern:
            bounds.append(f"matches `{pattern}`")
    if bounds:
        text = f"{text} ({', '.join(bounds)})" if text else ", ".join(bounds)
    return text


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
