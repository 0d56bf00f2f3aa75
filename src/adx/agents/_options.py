"""Checks the runtime's option dataclasses run in ``__post_init__``: each error names the field and the reason."""

from __future__ import annotations

from adx.errors import InvalidInputError

__all__ = ["require_at_least", "require_between", "require_positive"]


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
