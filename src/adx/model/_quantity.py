"""Parsing CPU and byte quantities from what people write ("500m", "1.5", "512Mi", "2G")."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from adx.errors import InvalidInputError

# Largest value any quantity may take: it must fit a signed 64-bit integer everywhere (Redis, SQLite, proto).
MAX_QUANTITY = 2**63 - 1

_BYTE_UNITS = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def _check_int(field: str, value: int) -> int:
    if value < 0:
        raise InvalidInputError(field, f"must not be negative, got {value}")
    if value > MAX_QUANTITY:
        raise InvalidInputError(field, f"is too large (more than {MAX_QUANTITY})")
    return value


def _number(field: str, value: object) -> Decimal | None:
    """A plain number as Decimal, or None when ``value`` is a string to parse with units."""
    if isinstance(value, bool):
        raise InvalidInputError(field, "must be a number, not a boolean")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(field, f"must be a finite number, got {value}")
        return Decimal(repr(value))
    if isinstance(value, str):
        return None
    raise InvalidInputError(field, f"must be a number or a quantity string, got {type(value).__name__}")


def parse_bytes(field: str, value: object) -> int:
    """Bytes from an int or a string with an optional SI or binary suffix ("512Mi", "2G", "1048576")."""
    number = _number(field, value)
    if number is None:
        match = _QUANTITY.match(str(value))
        if not match or match.group(2) not in _BYTE_UNITS:
            raise InvalidInputError(field, f"is not a byte quantity: {value!r} (examples: 1048576, 512Mi, 2G)")
        number = Decimal(match.group(1)) * _BYTE_UNITS[match.group(2)]
    if number != number.to_integral_value():
        raise InvalidInputError(field, f"must be a whole number of bytes, got {value!r}")
    if number > MAX_QUANTITY:
        raise InvalidInputError(field, f"is too large (more than {MAX_QUANTITY})")
    return _check_int(field, int(number))


def parse_cpu_millis(field: str, value: object) -> int:
    """Millicores from cores (1, 0.5, "1.5") or millicores ("500m")."""
    number = _number(field, value)
    if number is None:
        text = str(value).strip()
        try:
            if text.endswith("m"):
                number = Decimal(text[:-1])
                millis = number
            else:
                number = Decimal(text)
                millis = number * 1000
        except InvalidOperation:
            raise InvalidInputError(field, f"is not a CPU quantity: {value!r} (examples: 1, 0.5, 500m)") from None
    else:
        millis = number * 1000
    if not millis.is_finite():
        raise InvalidInputError(field, f"must be a finite number, got {value!r}")
    if millis != millis.to_integral_value():
        raise InvalidInputError(field, f"must be a whole number of millicores, got {value!r}")
    if millis > MAX_QUANTITY:
        raise InvalidInputError(field, f"is too large (more than {MAX_QUANTITY} millicores)")
    return _check_int(field, int(millis))
