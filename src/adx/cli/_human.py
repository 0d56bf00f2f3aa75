"""Times and durations as a person reads them: dates with their zone, ``1h30m`` rather than ``5400s``, and
``never`` for a timer that is off. (Sizes and CPU: ``adx.model.format_bytes`` / ``format_cpu``.)"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?$")


def format_time(unix: float) -> str:
    """``2026-12-01 07:55:23 UTC``: the local date, time and zone (a bare ``07:55:23`` is ambiguous past
    midnight, and across machines)."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(unix))


def format_duration(seconds: float) -> str:
    """``45s``, ``5m``, ``1h30m``, ``2d3h``: the two largest units; under 10 s, one decimal (``1.5s``)."""
    if seconds < 10:
        return f"{seconds:.1f}".removesuffix(".0") + "s"
    rest = round(seconds)
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts[:2])


def format_timer(seconds: float) -> str:
    """A timer whose 0 means off (the idle timeout): ``never``, else its duration."""
    return "never" if seconds <= 0 else format_duration(seconds)


def format_deadline(unix: float, now: float | None = None) -> str:
    """``2026-12-01 07:55:23 UTC (in 4m59s)`` or ``(... ago)`` once it passed."""
    left = unix - (time.time() if now is None else now)
    when = f"in {format_duration(left)}" if left >= 0 else f"{format_duration(-left)} ago"
    return f"{format_time(unix)} ({when})"


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """Plain aligned columns (never cut: an ID must stay whole when the terminal is narrow or output piped)."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in (header, *rows)
    )


def parse_duration(text: str) -> float | None:
    """Seconds of ``45s``, ``10m``, ``1h30m`` or ``2d``; None when the text is not such a duration."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        return None
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return days * 86_400 + hours * 3600 + minutes * 60 + seconds
