"""Resource amounts (CPU millicores, memory bytes, disk bytes) and admission arithmetic."""

from __future__ import annotations

import math

from pydantic import Field

from adx.model._base import ApiModel, WholeNumber
from adx.model._quantity import MAX_QUANTITY

#: The largest CPU overcommit ratio a node may declare (a typo like 400 must not open a node without bound).
MAX_CPU_OVERCOMMIT = 64.0


class Resources(ApiModel):
    """An amount of CPU (millicores), memory and disk (bytes). HTTP: ``cpuMillis``, ``memoryBytes``, ``diskBytes``."""

    cpu_millis: WholeNumber = Field(default=0, ge=0, le=MAX_QUANTITY)
    memory_bytes: WholeNumber = Field(default=0, ge=0, le=MAX_QUANTITY)
    disk_bytes: WholeNumber = Field(default=0, ge=0, le=MAX_QUANTITY)

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            cpu_millis=min(self.cpu_millis + other.cpu_millis, MAX_QUANTITY),
            memory_bytes=min(self.memory_bytes + other.memory_bytes, MAX_QUANTITY),
            disk_bytes=min(self.disk_bytes + other.disk_bytes, MAX_QUANTITY),
        )

    def minus_floor_zero(self, other: Resources) -> Resources:
        """``max(self - other, 0)`` per dimension."""
        return Resources(
            cpu_millis=max(self.cpu_millis - other.cpu_millis, 0),
            memory_bytes=max(self.memory_bytes - other.memory_bytes, 0),
            disk_bytes=max(self.disk_bytes - other.disk_bytes, 0),
        )

    def fits_within(self, available: Resources) -> bool:
        """True if this request fits ``available`` on every dimension (a zero request always fits)."""
        return (
            self.cpu_millis <= available.cpu_millis
            and self.memory_bytes <= available.memory_bytes
            and self.disk_bytes <= available.disk_bytes
        )

    def shortfall(self, available: Resources) -> list[str]:
        """Names of the dimensions on which this request does not fit ``available``."""
        names = []
        if self.cpu_millis > available.cpu_millis:
            names.append("cpu")
        if self.memory_bytes > available.memory_bytes:
            names.append("memory")
        if self.disk_bytes > available.disk_bytes:
            names.append("disk")
        return names


def allocatable(capacity: Resources, reserved: Resources) -> Resources:
    """RES-4: ``allocatable = max(capacity - reserved, 0)``, the one formula node and Coordinator share."""
    return capacity.minus_floor_zero(reserved)


def admission_limit(capacity: Resources, cpu_overcommit: float = 1.0) -> Resources:
    """What a node admits reservations up to: its CPU capacity times its overcommit ratio (rounded down, as the
    Coordinator's Lua does), memory and disk exactly as sampled (never overcommitted: they cannot be shared)."""
    cpu = min(math.floor(capacity.cpu_millis * cpu_overcommit), MAX_QUANTITY)
    return capacity.model_copy(update={"cpu_millis": cpu})
