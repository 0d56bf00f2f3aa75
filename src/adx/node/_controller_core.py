"""What every step of a Controller works on: the Environment's record, its execution, its queue, and the
contracts it is given (where results are committed, where executions are remembered, readiness, admission).

The steps live in their own modules (``_controller_commit``, ``_controller_execution``, ``_controller_failure``,
``_controller_start``, ``_controller_pause``, ``_controller_delete``, ``_controller_network``), each a class
over this one; ``_controller.Controller`` puts them together behind the serial queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

from adx._backoff import Backoff
from adx.errors import InvalidInputError
from adx.model import CheckpointRef, CheckpointStorage, EnvironmentRecord, EnvironmentState
from adx.model._records import RecordChanges
from adx.node._journal import DegradationJournal
from adx.node._operations import Delete, Operation
from adx.node._replay import WireCommitter
from adx.runtime import Execution, RuntimeDriver

log = logging.getLogger("adx.node.controller")
S = EnvironmentState

#: MET-6: abnormal-cleanup and commit retries back off 1-32 s.
RETRY_MIN_SECONDS = 1.0
RETRY_MAX_SECONDS = 32.0


class ResultSink(WireCommitter, Protocol):
    """Commits a Controller's results to the Coordinator (CAS on revision and generation)."""

    async def commit(
        self, record: EnvironmentRecord, changes: RecordChanges, *, release_reservation: bool = False
    ) -> EnvironmentRecord: ...

    async def fetch(self, env_id: str) -> EnvironmentRecord | None:
        """The authoritative record (None when the Coordinator no longer gives it to this node)."""


class ExecutionStore(Protocol):
    """Where the node keeps what it needs to address its executions after a restart."""

    def save(self, execution: Execution) -> None: ...

    def get(self, execution_id: str) -> Execution | None: ...

    def forget(self, execution_id: str) -> None: ...


class ReadinessProbe(Protocol):
    async def wait_ready(self, execution: Execution, within_seconds: float) -> None: ...


class Admission(Protocol):
    """The two admission gates in front of an execution (IDLE-6): the Relay's and execd's."""

    async def close_admission(self, env_id: str, execution: Execution) -> None:
        """Close both, whatever the activity (a manual pause)."""

    async def reopen_admission(self, env_id: str, execution: Execution) -> None: ...


@dataclass(frozen=True)
class CheckpointPlaces:
    """This node's checkpoint storage: sandboxd artifact roots for ``local`` and (if any) ``shared``."""

    node: str
    default_storage: str = "local"
    shared_root: str | None = None
    #: Where the shared storage is mounted on this host (from the runtime at start): it may differ per node.
    shared_path: str | None = None

    def locate(self, checkpoint: CheckpointRef) -> str:
        """The checkpoint's location on this node. A shared artifact is found under this node's mount of the
        shared storage, whatever path the publishing node had; a local one exists only where it was made."""
        if checkpoint.storage == "shared" and self.shared_path is not None:
            return str(Path(self.shared_path) / Path(checkpoint.location).name)
        return checkpoint.location

    def resolve(self, requested: CheckpointStorage) -> tuple[str, str]:
        """(kind, runtime storage name) for a pause's ``storage`` option (ENV-3)."""
        kind = self.default_storage if requested is CheckpointStorage.CONFIGURED else requested.value
        if kind == "shared":
            if self.shared_root is None:
                raise InvalidInputError(
                    "lifecycle.pauseOptions.storage", f"'shared' needs shared storage, and node {self.node} has none"
                )
            return "shared", self.shared_root
        return "local", "local"


class PauseGate:
    """One pause in progress (IDLE-6): demand seen before capture cancels it; after capture starts, demand is
    told to go through the resume entry (EnsureRunning) instead."""

    def __init__(self) -> None:
        self.demand = False
        self.decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def settle(self, serve: bool) -> None:
        """``serve``: the pause was cancelled and waiting requests proceed; else they go to the resume entry."""
        if not self.decided.done():
            self.decided.set_result(serve)

    async def wait(self, within: float) -> bool:
        """Register demand and wait for the decision (False: the Environment is pausing)."""
        self.demand = True
        try:
            return await asyncio.wait_for(asyncio.shield(self.decided), within)
        except TimeoutError:
            return False


@dataclass
class PendingCheckpoint:
    """CTL-7: one workload checkpoint request, kept until committed and acknowledged."""

    operation_id: str
    execution_id: str
    deadline: float  # monotonic; set when first observed, never extended by duplicates
    checkpoint: CheckpointRef | None = None  # captured: later attempts commit/ack it without re-capturing
    committed: bool = False
    retry_delay: Backoff = field(default_factory=lambda: Backoff(RETRY_MIN_SECONDS, RETRY_MAX_SECONDS))


@dataclass(frozen=True)
class DroppedResults:
    """NOD-10/NOD-11: journaled results the Coordinator refused for good, until the Controller has converged to
    the authority's record (Step.CONVERGE): what they led to and made, which nothing published references."""

    #: The local record the dropped results had led to (no authority: the Coordinator never stored it).
    local: EnvironmentRecord
    #: The Coordinator's record they were judged against (None: it no longer gives the Environment to this node).
    authority: EnvironmentRecord | None
    #: True when ``authority`` (same node and generation) replaced the local record.
    adopted: bool
    #: The checkpoints the dropped results referenced (captured here during the outage, published nowhere).
    checkpoints: tuple[CheckpointRef, ...]


@dataclass
class _Queued:
    operation: Operation
    done: asyncio.Future[EnvironmentRecord]


@dataclass(frozen=True)
class ControllerTimings:
    ready_timeout_seconds: float = 60.0
    retry_min_seconds: float = RETRY_MIN_SECONDS
    retry_max_seconds: float = RETRY_MAX_SECONDS


class LogContext(TypedDict):
    """What every Controller log line carries (its ``extra``): whose transition, of which execution and generation."""

    env_id: str
    execution_id: str | None
    generation: int
    state: str


@dataclass(eq=False)
class ControllerCore:
    """The state of one Environment's Controller, shared by its steps."""

    record: EnvironmentRecord
    _: KW_ONLY
    driver: RuntimeDriver
    sink: ResultSink
    executions: ExecutionStore
    readiness: ReadinessProbe
    on_route_change: Callable[[EnvironmentRecord, Execution | None], Awaitable[None]] | None = None
    timings: ControllerTimings = ControllerTimings()
    execution: Execution | None = None
    admission: Admission | None = None
    places: CheckpointPlaces
    ack_checkpoint: Callable[[Execution, str], Awaitable[None]] | None = None
    journal: DegradationJournal | None = None
    # JRN-3: how many of this Environment's results wait in the degradation journal; while any does, later
    # results are journaled behind them, never committed ahead of them.
    unpublished: int = 0
    on_transition: Callable[[str], None] | None = None
    pause_gate: PauseGate | None = field(default=None, init=False)
    checkpoint_requests: dict[str, PendingCheckpoint] = field(default_factory=dict, init=False)
    _queue: asyncio.Queue[_Queued] = field(default_factory=asyncio.Queue, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _exit_watch: asyncio.Task[None] | None = field(default=None, init=False)
    _background: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    _restart_timer: asyncio.Task[None] | None = field(default=None, init=False)
    # True while the current execution may take data-plane traffic (ready, not being retired).
    serving: bool = field(default=False, init=False)
    # True while a result is done locally and its commit is retried in memory (NOD-7; no journal entry).
    commit_retrying: bool = field(default=False, init=False)
    _replay_queued: bool = field(default=False, init=False)
    # NOD-10/NOD-11: a recovery that failed, or journaled results refused by a Coordinator that no longer gives
    # this ownership to the node; only this Controller waits for the routine check to decide.
    restricted: bool = field(default=False, init=False)
    # Journaled results the Coordinator refused, waiting for Step.CONVERGE (the authority's record is adopted).
    dropped: DroppedResults | None = field(default=None, init=False)
    # How many Delete operations are queued or running: the routine check retries a `deleting` record only when
    # none is (a delete refused as stale must not leave it deleting forever).
    deletes_queued: int = field(default=0, init=False)
    # NOD-10: the newest network revision the running execution cannot take in place (no veth); its next
    # start or resume applies it, so the routine check does not ask the runtime again every round.
    network_deferred_revision: int = field(default=0, init=False)
    # The Coordinator retired this Environment's placement before anything ran here, or its journaled results
    # were dropped because the ownership is gone and what they left was cleaned: the node forgets it.
    retired: bool = field(default=False, init=False)
    # NOD-12: a newer generation took this Environment over; this Controller only cleaned its execution.
    revoked: bool = field(default=False, init=False)
    closed: bool = field(default=False, init=False)

    @property
    def env_id(self) -> str:
        return self.record.id

    @property
    def state(self) -> EnvironmentState:
        return self.record.state

    @property
    def publication_pending(self) -> bool:
        """Done here, not yet stored by the cluster (ENV-6): journaled, or retried in memory."""
        return self.commit_retrying or self.unpublished > 0

    @property
    def closed_for_good(self) -> bool:
        return self._task is None or self._task.done()

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def submit(self, operation: Operation) -> asyncio.Future[EnvironmentRecord]:
        queued = _Queued(operation, asyncio.get_running_loop().create_future())
        # Many submitters never await the result (routine checks, timers): the failure is logged by _run.
        queued.done.add_done_callback(_mark_retrieved)
        if isinstance(operation, Delete):
            self.deletes_queued += 1  # counted down by the Controller's loop once it has run
        self._queue.put_nowait(queued)
        return queued.done

    def _context(self) -> LogContext:
        return {
            "env_id": self.env_id,
            "execution_id": self.execution.execution_id if self.execution else self.record.execution_id,
            "generation": self.record.generation,
            "state": self.record.state.value,
        }


def _mark_retrieved(future: asyncio.Future[EnvironmentRecord]) -> None:
    if not future.cancelled():
        future.exception()
