"""CPU and byte quantities: parsed from what people write ("500m", "1.5", "512Mi", "512MB", "0.5GiB") and
formatted back the same way ("512Mi", "250m")."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from adx.errors import InvalidInputError

# Largest value any quantity may take: JSON's exact-integer range (2^53 - 1: every JSON parser reads it, or a
# whole float on the wire, without rounding; 8 PiB of memory), inside a signed 64-bit integer everywhere.
MAX_QUANTITY = 2**53 - 1

# Byte units as people write them. SI (powers of 1000): Kubernetes' k/M/G and the everyday kB/MB/GB. Binary
# (powers of 1024): Kubernetes' Ki/Mi/Gi and the IEC KiB/MiB/GiB (any case: "mib" is unambiguous).
_SI = {"k": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
_BYTE_UNITS: dict[str, int] = {"": 1, "B": 1}
for _prefix, _power in _SI.items():
    _BYTE_UNITS[_prefix] = _BYTE_UNITS[_prefix + "B"] = 1000**_power
for _power, _prefix in enumerate(("K", "M", "G", "T", "P"), start=1):
    _BYTE_UNITS[_prefix + "i"] = 1024**_power
_BINARY_ANY_CASE: dict[str, int] = {f"{p}ib": 1024**n for n, p in enumerate("kmgtp", start=1)}
# Lower-case m/g/t mean MiB/GiB/TiB to Docker and milli to Kubernetes: refused rather than guessed.
_AMBIGUOUS = {"m": "M", "g": "G", "t": "T", "mb": "M", "gb": "G", "tb": "T"}
_QUANTITY = re.compile(r"^\s*([-+]?[0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
_BYTE_EXAMPLES = "examples: 536870912, 512Mi, 512MiB, 512MB, 0.5GiB"


def _byte_unit(field: str, value: object, unit: str) -> int:
    if unit in _BYTE_UNITS:
        return _BYTE_UNITS[unit]
    binary = _BINARY_ANY_CASE.get(unit.lower())
    if binary is not None:
        return binary
    if unit in _AMBIGUOUS:
        si = _AMBIGUOUS[unit]
        raise InvalidInputError(
            field, f"unit {unit!r} in {value!r} is ambiguous: write {si}i (1024-based, e.g. 512{si}i) or {si}B"
        )
    raise InvalidInputError(field, f"unknown unit {unit!r} in {value!r} ({_BYTE_EXAMPLES})")


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
    """Bytes from an int or a string with an optional unit: "536870912", "512Mi", "512MiB", "512MB", "0.5GiB".

    Errors quote the value as given (``-1``, not what it was converted to)."""
    number = _number(field, value)
    if number is None:
        match = _QUANTITY.match(str(value))
        if not match:
            raise InvalidInputError(field, f"is not a byte quantity: {value!r} ({_BYTE_EXAMPLES})")
        number = Decimal(match.group(1)) * _byte_unit(field, value, match.group(2))
    return _whole(field, value, number, "bytes")


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
    return _whole(field, value, millis, "millicores")


def _whole(field: str, value: object, number: Decimal, unit: str) -> int:
    """``number`` (of ``unit``, parsed from ``value``) as a whole, non-negative count within MAX_QUANTITY; errors
    quote the value as given."""
    if number < 0:
        raise InvalidInputError(field, f"must not be negative, got {_as_given(value)}")
    if number != number.to_integral_value():
        raise InvalidInputError(field, f"must be a whole number of {unit}, got {_as_given(value)}")
    if number > MAX_QUANTITY:
        raise InvalidInputError(field, f"is too large (more than {MAX_QUANTITY} {unit})")
    return _check_int(field, int(number))


def _as_given(value: object) -> str:
    return value.strip() if isinstance(value, str) else repr(value)


def format_bytes(value: int) -> str:
    """Bytes as people read them, in the units ``parse_bytes`` accepts back: 536870912 -> "512Mi",
    1610612736 -> "1.5Gi", 1000 -> "1000B"; an inexact size keeps one decimal ("117.7Mi")."""
    if value < 1024:
        return f"{value}B"
    size = float(value)
    for unit in ("Ki", "Mi", "Gi", "Ti", "Pi"):
        size /= 1024
        if size < 1024 or unit == "Pi":
            break
    text = f"{size:.1f}".removesuffix(".0")
    return f"{text}{unit}"


def format_cpu(millis: int) -> str:
    """Millicores in the spelling ``parse_cpu_millis`` accepts back: 1000 -> "1", 2500 -> "2.5", 250 -> "250m"."""
    if millis % 100 == 0 and millis >= 1000:
        return f"{millis / 1000:g}"
    return f"{millis}m"
