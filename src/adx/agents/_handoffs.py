"""What the driver hands the lifecycle: one exact handoff per claim (wait, success, failure, cancellation or
release), each carrying the lifecycle event identity assigned once by the driver."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from adx.agents._rows import Claim, WaitRegistration
from adx.agents._status import AttemptStatus

__all__ = [
    "CancellationHandoff",
    "FailureHandoff",
    "Handoff",
    "ReleaseHandoff",
    "ReleaseKind",
    "SuccessHandoff",
    "WaitHandoff",
]


class ReleaseKind(StrEnum):
    DEFERRED = "deferred"
    YIELDED = "yielded"
    RECOVERY_RELEASED = "recovery_released"


@dataclass(frozen=True, slots=True)
class _Edge:
    """What every handoff names first: the claim it ends, its lifecycle event's identity (assigned once, so a
    retried commit is recognised as the same edge) and the step (checkpoint) it hands off at."""

    claim: Claim
    event_id: uuid.UUID
    step: int


@dataclass(frozen=True, slots=True)
class WaitHandoff(_Edge):
    attempt_id: uuid.UUID
    resume_node: str
    state: Any
    waits: tuple[WaitRegistration, ...]


@dataclass(frozen=True, slots=True)
class SuccessHandoff(_Edge):
    artifact: Any
    usage: dict[str, int]
    revision: int = 0  # the run revision the driver last committed or claimed (AGT-9 replay expects + 1)


@dataclass(frozen=True, slots=True)
class FailureHandoff(_Edge):
    reason: str
    attempt_id: uuid.UUID | None
    in_flight: tuple[uuid.UUID, ...] = ()
    revision: int = 0


@dataclass(frozen=True, slots=True)
class CancellationHandoff(_Edge):
    attempt_id: uuid.UUID | None
    usage: dict[str, int]
    revision: int = 0


@dataclass(frozen=True, slots=True)
class ReleaseHandoff(_Edge):
    kind: ReleaseKind
    reason: str
    delay_s: float
    attempt_id: uuid.UUID | None
    attempt_status: AttemptStatus | None
    error: str | None = None


Handoff = WaitHandoff | SuccessHandoff | FailureHandoff | CancellationHandoff | ReleaseHandoff
