"""The runtime's option dataclasses: the checks they run in ``__post_init__`` (each error names the field and the
reason), and building one from a component's configuration."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from adx.errors import InvalidInputError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["options_from", "require_at_least", "require_between", "require_positive"]

_Options = TypeVar("_Options", bound="DataclassInstance")


def require_positive(options: object, *names: str) -> None:
    for name in names:
        if not getattr(options, name) > 0:
            raise InvalidInputError(name, "must be positive")


def require_at_least(options: object, low: int, *names: str) -> None:
    for name in names:
        if getattr(options, name) < low:
            raise InvalidInputError(name, f"must be at least {low}")


def require_between(options: object, low: int, high: int, *names: str) -> None:
    for name in names:
        if not low <= getattr(options, name) <= high:
            raise InvalidInputError(name, f"must be between {low} and {high}")


def options_from(options: type[_Options], config: BaseModel, **given: Any) -> _Options:
    """``options`` with every field the configuration spells the same (a component's configuration names the
    runtime's options), overridden by ``given`` (values the configuration holds in another form); a field that
    is in neither keeps its default. The dataclass still checks every value."""
    configured = type(config).model_fields
    values = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(options)
        if f.init and f.name in configured and f.name not in given
    }
    return options(**values, **given)
