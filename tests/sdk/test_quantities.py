"""Quantities as people write them, through the SDK's own spec builder (the checks run before any request, with
the same model the server validates with), and formatted back in the same spelling."""

from __future__ import annotations

import pytest

import adx
from adx.model import format_bytes, format_cpu, parse_bytes, parse_cpu_millis
from adx.sdk import build_spec

MI = 2**20


@pytest.mark.req("ENV-1")
@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        ("512Mi", 512 * MI),
        ("512MiB", 512 * MI),
        ("512 mib", 512 * MI),
        ("0.5GiB", 512 * MI),
        ("0.5Gi", 512 * MI),
        ("512MB", 512 * 10**6),
        ("512M", 512 * 10**6),
        ("1GB", 10**9),
        ("536870912", 512 * MI),
        (536870912, 512 * MI),
        ("1048576B", MI),
    ],
)
def test_memory_accepts_the_common_spellings(memory: object, expected: int) -> None:
    assert build_spec(cpu=1, memory=memory)["resources"]["memoryBytes"] == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("memory", "says"),
    [
        ("512m", "unit 'm' in '512m' is ambiguous: write Mi (1024-based, e.g. 512Mi) or MB"),
        ("2g", "ambiguous: write Gi"),
        ("512Q", "unknown unit 'Q' in '512Q' (examples: 536870912, 512Mi, 512MiB, 512MB, 0.5GiB)"),
        ("-512Mi", "must not be negative, got -512Mi"),
        ("0.3B", "must be a whole number of bytes, got 0.3B"),
    ],
)
def test_memory_refusals_name_the_argument_and_the_fix(memory: str, says: str) -> None:
    with pytest.raises(adx.InvalidInputError) as caught:
        build_spec(cpu=1, memory=memory)
    assert caught.value.field == "memory" and says in caught.value.reason, caught.value.reason


@pytest.mark.parametrize(("cpu", "says"), [(-1, "got -1"), ("-1", "got -1"), ("-250m", "got -250m")])
def test_negative_cpu_quotes_what_was_given(cpu: object, says: str) -> None:
    """Not the millicores it was converted to (the issue's `--cpu=-1` -> 'got -1000')."""
    with pytest.raises(adx.InvalidInputError) as caught:
        build_spec(cpu=cpu, memory="512Mi")  # type: ignore[arg-type]
    assert caught.value.field == "cpu" and caught.value.reason == f"must not be negative, {says}"


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0B"), (1023, "1023B"), (1024, "1Ki"), (512 * MI, "512Mi"), (3 * 2**29, "1.5Gi"), (123456789, "117.7Mi")],
)
def test_sizes_format_as_people_write_them(value: int, text: str) -> None:
    assert format_bytes(value) == text
    if text != "117.7Mi":  # an inexact size is rounded to one decimal
        assert parse_bytes("x", text) == value  # what is printed can be typed back


@pytest.mark.parametrize(("millis", "text"), [(1000, "1"), (2500, "2.5"), (250, "250m"), (1250, "1250m")])
def test_cpu_formats_as_people_write_it(millis: int, text: str) -> None:
    assert format_cpu(millis) == text
    assert parse_cpu_millis("cpu", text) == millis
