"""Identifiers: random, URL-safe, prefixed by kind, never reused."""

from __future__ import annotations

import base64
import re
import secrets

from adx.errors import InvalidInputError

_ID_RE = re.compile(r"^(?P<kind>[a-z]{2,4})-(?P<body>[a-z2-7]{26})$")

ENVIRONMENT = "env"
EXECUTION = "exe"
OPERATION = "op"
CHECKPOINT = "ckp"


def new_id(kind: str) -> str:
    """``<kind>-<26 base32 chars>``: 130 random bits, lowercase so it survives DNS labels and paths."""
    body = base64.b32encode(secrets.token_bytes(17)).decode().lower().rstrip("=")[:26]
    return f"{kind}-{body}"


def check_id(field: str, value: object, kind: str) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(field, f"must be a string ID, got {type(value).__name__}")
    match = _ID_RE.match(value)
    if not match or match.group("kind") != kind:
        raise InvalidInputError(field, f"is not a valid {kind} ID: {value[:80]!r}")
    return value
