"""Canonical JSON and digests: one byte form per value, so digests are computed, never written by hand."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, TypeAlias

__all__ = ["JsonObject", "canonical_json", "digest", "json_clone"]

#: A JSON object whose keys and values belong to the user or the journal, not to this code: a run's request,
#: descriptor and budget as admitted, a journal event or result document, a step's payload. These are stored as
#: JSONB and compared and digested as written, so they stay plain dicts (a typed model would reorder or coerce
#: them); the runtime's own records are dataclasses.
JsonObject: TypeAlias = dict[str, Any]


def _check(value: Any, path: str) -> None:
    # JSON has no NaN/Infinity and object keys must be strings; reject early so two equal values never
    # produce two different canonical forms.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path}: non-finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{path}: object key {key!r} is not a string")
            _check(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
    elif not (value is None or isinstance(value, str | int | float | bool)):
        raise ValueError(f"{path}: {type(value).__name__} is not JSON")


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8: the byte form every digest is computed from."""
    _check(value, "$")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def json_clone(value: Any) -> Any:
    """A deep copy through JSON: what a value looks like after a round trip through the database."""
    return json.loads(canonical_json(value))
