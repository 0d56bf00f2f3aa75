"""Typed values the runtime hands out: run status, wait kinds, and what a resumed node learns (``ctx.wake``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["RunStatus", "WaitKind", "Wake"]


class RunStatus(StrEnum):
    """A run's status. Compares equal to its string (``RunStatus.WAITING == "waiting"``)."""

    QUEUED = "queued"  # admitted or given back; claimable when due
    RUNNING = "running"  # claimed by a worker (under a lease)
    WAITING = "waiting"  # suspended on interrupts/timers; claimable when one fires or cancellation is asked
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


class WaitKind(StrEnum):
    INTERRUPT = "interrupt"
    TIMER = "timer"


@dataclass(frozen=True, slots=True)
class Wake:
    """One wait of the wait set a node resumes from: ``resolved`` (an interrupt was answered with
    ``resolution``) or ``fired`` (a timer came due by database time); neither when another wait woke the run."""

    wait_id: str
    kind: WaitKind
    payload: Any
    resolved: bool
    fired: bool
    resolution: Any

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Wake:
        return cls(
            wait_id=row["wait_id"],
            kind=WaitKind(row["kind"]),
            payload=row["payload"],
            resolved=bool(row["resolved"]),
            fired=bool(row["fired"]),
            resolution=row["resolution"],
        )
