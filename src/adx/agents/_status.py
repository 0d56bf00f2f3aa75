"""Typed values the runtime hands out: run status, wait kinds, and what a resumed node learns (``ctx.wake``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["AttemptStatus", "CheckpointKind", "ChildOutcome", "RunStatus", "WaitKind", "Wake"]


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


class CheckpointKind(StrEnum):
    """What wrote a checkpoint: admission (step 0), a node commit, a wait edge, or the terminal edge."""

    INITIAL = "initial"
    NODE = "node"
    WAIT = "wait"  # the run resumes from this checkpoint's wait set
    TERMINAL = "terminal"


class AttemptStatus(StrEnum):
    """A recorded node, model or tool attempt: ``started`` until its outcome is recorded."""

    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"  # a node attempt of a lower fence that never finished (its worker died)
    SKIPPED = "skipped"  # a node attempt started for a step that was handed off before it ran


class WaitKind(StrEnum):
    INTERRUPT = "interrupt"
    TIMER = "timer"
    JOIN = "join"  # child runs (ctx.spawn) finishing; the maintenance role publishes it


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How one child run of a published join ended: its status, and its artifact or failure."""

    run_id: uuid.UUID
    graph: str
    status: RunStatus
    artifact: Any
    failure: Any

    @property
    def succeeded(self) -> bool:
        return self.status is RunStatus.SUCCEEDED


@dataclass(frozen=True, slots=True)
class Wake:
    """One wait of the wait set a node resumes from: ``resolved`` (an interrupt was answered with
    ``resolution``, or a join was published: every child finished) or ``fired`` (a timer came due by database
    time); neither when another wait woke the run."""

    wait_id: str
    kind: WaitKind
    payload: Any
    resolved: bool
    fired: bool
    resolution: Any

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Wake:
        return cls(
            wait_id=row["wait_id"],
            kind=WaitKind(row["kind"]),
            payload=row["payload"],
            resolved=bool(row["resolved"]),
            fired=bool(row["fired"]),
            resolution=row["resolution"],
        )

    @property
    def children(self) -> tuple[ChildOutcome, ...]:
        """A published join's child outcomes, in the order the join named them (empty for other waits)."""
        if self.kind is not WaitKind.JOIN or not self.resolved or not isinstance(self.resolution, dict):
            return ()
        return tuple(
            ChildOutcome(
                run_id=uuid.UUID(c["run_id"]),
                graph=c["graph"],
                status=RunStatus(c["status"]),
                artifact=c.get("artifact"),
                failure=c.get("failure"),
            )
            for c in self.resolution.get("children", ())
        )
