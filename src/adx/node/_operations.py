"""The operations a Controller runs, one at a time, in the order they were submitted (NOD-1).

The ones that need nothing are the values of ``Step``; each other is a small frozen value naming what it needs,
so a submitter cannot misspell an operation or forget its argument, and the Controller's loop dispatches on the
value or the type. ``kind`` is the name its log lines use.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from adx.model import CheckpointRef, EnvironmentRecord
from adx.runtime import ExitInfo

__all__ = [
    "Adopt",
    "After",
    "Delete",
    "Exited",
    "Operation",
    "Pause",
    "Resume",
    "SetNetwork",
    "Snapshot",
    "Step",
    "WorkloadCheckpoint",
]


class Step(Enum):
    """The operations that carry nothing but what to do: one value each, its name the one log lines use."""

    #: The first start of a Pending Environment placed here.
    START = "start"
    #: After a node restart: a Starting record whose execution never came up goes on under the same execution.
    CONTINUE_START = "continue_start"
    #: After a node restart: the execution of a Starting record runs; only its Running commit was cut short.
    FINISH_START = "finish_start"
    #: A pending restart's backoff ran out (RST-2).
    RESTART = "restart"
    #: After a node restart mid-pause with nothing published: the execution runs on.
    CANCEL_PAUSE = "cancel_pause"
    #: Demand for an Environment whose pause is done here but not published yet (JRN-3, JRN-4).
    RESUME_LOCAL = "resume_local"
    #: Publish this Environment's journaled results in order (NOD-17).
    REPLAY = "replay"
    #: A barrier: done once every operation submitted before it has run.
    NOOP = "noop"
    #: A newer generation took this Environment over: clean this generation's execution, then refuse (NOD-12).
    REVOKE = "revoke"
    #: The Coordinator refused this Environment's journaled results for good: converge to its record (NOD-10).
    CONVERGE = "converge"

    @property
    def kind(self) -> str:
        return self.value


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
class Pause:
    """Checkpoint and release; ``auto`` when the idle timer asked (admission is already closed by then)."""

    auto: bool = False
    kind: ClassVar[str] = "pause"


@dataclass(frozen=True)
class Resume:
    """Restore from the record's checkpoint; ``record`` is the Coordinator's newer Resuming record, if any."""

    record: EnvironmentRecord | None = None
    kind: ClassVar[str] = "resume"


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


Operation = Step | Delete | Exited | Pause | Resume | WorkloadCheckpoint | Snapshot | After | Adopt | SetNetwork
