"""The operations a Controller runs, one at a time, in the order they were submitted (NOD-1).

Each is a small frozen value naming what it needs, so a submitter cannot misspell an operation or forget its
argument, and the Controller's loop dispatches on the type. ``kind`` is the name its log lines use.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

from adx.model import CheckpointRef, EnvironmentRecord
from adx.runtime import ExitInfo

__all__ = [
    "Adopt",
    "After",
    "CancelPause",
    "ContinueStart",
    "Delete",
    "Exited",
    "FinishStart",
    "Noop",
    "Operation",
    "Pause",
    "Replay",
    "Restart",
    "Resume",
    "ResumeLocal",
    "Revoke",
    "SetNetwork",
    "Snapshot",
    "Start",
    "WorkloadCheckpoint",
]


@dataclass(frozen=True)
class Start:
    """The first start of a Pending Environment placed here."""

    kind: ClassVar[str] = "start"


@dataclass(frozen=True)
class ContinueStart:
    """After a node restart: a Starting record whose execution never came up goes on under the same execution."""

    kind: ClassVar[str] = "continue_start"


@dataclass(frozen=True)
class FinishStart:
    """After a node restart: the execution of a Starting record runs; only its Running commit was cut short."""

    kind: ClassVar[str] = "finish_start"


@dataclass(frozen=True)
class Delete:
    """Delete the execution and commit Deleted; ``record`` is the Coordinator's delete, adopted in order."""

    record: EnvironmentRecord | None = None
    kind: ClassVar[str] = "delete"


@dataclass(frozen=True)
class Exited:
    """The runtime reported that ``execution_id`` ended (``info`` None: it ended while the node was away)."""

    execution_id: str
    info: ExitInfo | None
    kind: ClassVar[str] = "exited"


@dataclass(frozen=True)
class Restart:
    """A pending restart's backoff ran out (RST-2)."""

    kind: ClassVar[str] = "restart"


@dataclass(frozen=True)
class Pause:
    """Checkpoint and release; ``auto`` when the idle timer asked (admission is already closed by then)."""

    auto: bool = False
    kind: ClassVar[str] = "pause"


@dataclass(frozen=True)
class CancelPause:
    """After a node restart mid-pause with nothing published: the execution runs on."""

    kind: ClassVar[str] = "cancel_pause"


@dataclass(frozen=True)
class Resume:
    """Restore from the record's checkpoint; ``record`` is the Coordinator's newer Resuming record, if any."""

    record: EnvironmentRecord | None = None
    kind: ClassVar[str] = "resume"


@dataclass(frozen=True)
class ResumeLocal:
    """Demand for an Environment whose pause is done here but not published yet (JRN-3, JRN-4)."""

    kind: ClassVar[str] = "resume_local"


@dataclass(frozen=True)
class WorkloadCheckpoint:
    """Capture the checkpoint the workload asked for under ``operation_id``."""

    operation_id: str
    kind: ClassVar[str] = "workload_checkpoint"


@dataclass(frozen=True)
class Snapshot:
    """Capture a checkpoint of the running execution for a snapshot, as WorkloadCheckpoint does, without the record
    referencing it: the Coordinator's snapshot catalog keeps it. ``result`` gets the artifact (or the error)."""

    operation_id: str
    result: asyncio.Future[CheckpointRef]
    kind: ClassVar[str] = "snapshot"


@dataclass(frozen=True)
class Replay:
    """Publish this Environment's journaled results in order (NOD-17)."""

    kind: ClassVar[str] = "replay"


@dataclass(frozen=True)
class Noop:
    """A barrier: done once every operation submitted before it has run."""

    kind: ClassVar[str] = "noop"


@dataclass(frozen=True)
class Revoke:
    """A newer generation took this Environment over: clean this generation's execution, then refuse (NOD-12)."""

    kind: ClassVar[str] = "revoke"


@dataclass(frozen=True)
class After:
    """Wait for another Controller's operation (the revoked generation's cleanup, RST-5) before going on."""

    prior: asyncio.Future[EnvironmentRecord]
    kind: ClassVar[str] = "after"


@dataclass(frozen=True)
class Adopt:
    """The authoritative record a restricted Controller waits for (NOD-10)."""

    record: EnvironmentRecord
    kind: ClassVar[str] = "adopt"


@dataclass(frozen=True)
class SetNetwork:
    """A network policy stored by the Coordinator, to apply in place (NOD-10)."""

    record: EnvironmentRecord
    kind: ClassVar[str] = "network"


Operation = (
    Start
    | ContinueStart
    | FinishStart
    | Delete
    | Exited
    | Restart
    | Pause
    | CancelPause
    | Resume
    | ResumeLocal
    | WorkloadCheckpoint
    | Snapshot
    | Replay
    | Noop
    | Revoke
    | After
    | Adopt
    | SetNetwork
)
