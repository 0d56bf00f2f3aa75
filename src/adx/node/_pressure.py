"""Memory and disk pressure admission (RES-7).

Each report round the node reads how full memory and the sandbox filesystem are. Either one at its high mark
closes admission of new Environments; admission reopens only once *both* are below their low marks (the gap
between the marks keeps a node hovering at one threshold from flapping). A read that fails closes admission
too: a node that cannot tell whether it is full must not take more. Running Environments are never touched;
this only decides whether new ones are admitted.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from adx.config._node import PressureConfig
from adx.errors import AdxError, UnavailableError

log = logging.getLogger("adx.node.pressure")


@dataclass(frozen=True)
class PressureReading:
    memory_used: float  # fraction of memory in use, 0..1
    disk_used: float  # fraction of the measured filesystem in use, 0..1


def read_memory_used(meminfo: Path) -> float:
    """``1 - MemAvailable / MemTotal`` from a /proc/meminfo-shaped file."""
    try:
        text = meminfo.read_text()
    except OSError as exc:
        raise UnavailableError(f"memory pressure: cannot read {meminfo}: {exc.strerror or exc}") from None
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name.strip()] = int(parts[0])
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    if not total or available is None:
        raise UnavailableError(f"memory pressure: {meminfo} has no MemTotal/MemAvailable")
    return min(max(1.0 - available / total, 0.0), 1.0)


def read_disk_used(path: Path) -> float:
    """Fraction of the filesystem holding ``path`` in use, as ``df`` counts it (reserved blocks excluded)."""
    try:
        st = os.statvfs(path)
    except OSError as exc:
        raise UnavailableError(f"disk pressure: cannot read {path}: {exc.strerror or exc}") from None
    used = st.f_blocks - st.f_bfree
    usable = used + st.f_bavail
    if usable <= 0:
        raise UnavailableError(f"disk pressure: {path} reports no usable blocks")
    return used / usable


class PressureGate:
    """The hysteresis of RES-7 over successive readings; ``reason`` says why admission is closed ("" = open)."""

    def __init__(self, config: PressureConfig) -> None:
        self.config = config
        self.closed = False
        self.reason = ""
        self.last: PressureReading | None = None

    def read(self, disk_path: Path) -> PressureReading:
        return PressureReading(
            memory_used=read_memory_used(self.config.meminfo_path), disk_used=read_disk_used(disk_path)
        )

    def observe(self, reading: PressureReading | None, error: str = "") -> bool:
        """Apply one reading (None with ``error``: the read failed). Returns whether admission is closed."""
        c = self.config
        self.last = reading
        if reading is None:
            self.closed, self.reason = True, f"pressure read failed: {error}"
            return True
        high = []
        if reading.memory_used >= c.memory_high:
            high.append(f"memory {reading.memory_used:.0%} >= high {c.memory_high:.0%}")
        if reading.disk_used >= c.disk_high:
            high.append(f"disk {reading.disk_used:.0%} >= high {c.disk_high:.0%}")
        if high:
            self.closed, self.reason = True, "pressure: " + ", ".join(high)
        elif self.closed and reading.memory_used < c.memory_low and reading.disk_used < c.disk_low:
            self.closed, self.reason = False, ""
        elif self.closed:
            # Between the marks after a high (or after a failed read): stays closed until both are below low.
            self.reason = (
                f"pressure: memory {reading.memory_used:.0%}, disk {reading.disk_used:.0%}; reopens below "
                f"memory {c.memory_low:.0%} and disk {c.disk_low:.0%}"
            )
        return self.closed


class PressureMonitor:
    """Reads pressure once per report round (off the event loop) and publishes the gate's verdict.

    ``disk_path`` says where to measure: the configured path, or sandboxd's state directory (asked each round,
    so a failure to learn it is a failed read, which closes admission).
    """

    def __init__(self, config: PressureConfig, disk_path: Callable[[], Awaitable[Path]]) -> None:
        self.config = config
        self.gate = PressureGate(config)
        self._disk_path = disk_path

    async def check(self) -> PressureGate:
        if not self.config.enabled:
            return self.gate
        try:
            path = self.config.disk_path or await self._disk_path()
            reading = await asyncio.to_thread(self.gate.read, path)
        except AdxError as exc:
            was_closed = self.gate.closed
            self.gate.observe(None, str(exc))
            if not was_closed:
                log.warning("admission closed: %s", self.gate.reason)
            return self.gate
        was_closed = self.gate.closed
        self.gate.observe(reading)
        if self.gate.closed != was_closed:
            log.warning("admission %s: %s", "closed" if self.gate.closed else "reopened", self.gate.reason or "")
        return self.gate
