"""One Controller per Environment: an asyncio task with its own queue and an explicit state machine.

A Controller never blocks another (NOD-4): each owns its queue and runs its operations serially. Every
state change is committed to the Coordinator (compare-and-set on revision and generation) through a
``ResultSink``; every transition is logged with the Environment ID, execution ID and generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from adx._backoff import Backoff
from adx.errors import (
    AdxError,
    ConflictError,
    EnvironmentPausedError,
    InvalidInputError,
    NotFoundError,
    SessionRejectedError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.model import (
    RESUME_FAILED,
    CheckpointRef,
    CheckpointStorage,
    EnvironmentRecord,
    EnvironmentState,
    check_transition,
    new_id,
)
from adx.node._coordinator_client import wire_changes
from adx.node._journal import DegradationJournal, NewResult, spec_digest
from adx.node._operations import (
    Adopt,
    After,
    CancelPause,
    ContinueStart,
    Delete,
    Exited,
    FinishStart,
    Noop,
    Operation,
    Pause,
    Replay,
    Restart,
    Resume,
    ResumeLocal,
    Revoke,
    SetNetwork,
    Snapshot,
    Start,
    WorkloadCheckpoint,
)
from adx.node._replay import ReplayEnd, WireCommitter, replay
from adx.runtime import Artifact, Execution, ExecutionSpec, ExitInfo, RuntimeDriver

log = logging.getLogger("adx.node.controller")
S = EnvironmentState

#: MET-6: abnormal-cleanup and commit retries back off 1-32 s.
RETRY_MIN_SECONDS = 1.0
RETRY_MAX_SECONDS = 32.0


class ResultSink(WireCommitter, Protocol):
    """Commits a Controller's results to the Coordinator (CAS on revision and generation)."""

    async def commit(
        self, record: EnvironmentRecord, changes: dict[str, Any], *, release_reservation: bool = False
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


@dataclass
class _Queued:
    operation: Operation
    done: asyncio.Future[EnvironmentRecord]


@dataclass(frozen=True)
class ControllerTimings:
    ready_timeout_seconds: float = 60.0
    retry_min_seconds: float = RETRY_MIN_SECONDS
    retry_max_seconds: float = RETRY_MAX_SECONDS


class Controller:
    def __init__(
        self,
        record: EnvironmentRecord,
        *,
        driver: RuntimeDriver,
        sink: ResultSink,
        executions: ExecutionStore,
        readiness: ReadinessProbe,
        on_route_change: Callable[[EnvironmentRecord, Execution | None], Awaitable[None]] | None = None,
        timings: ControllerTimings = ControllerTimings(),
        execution: Execution | None = None,
        admission: Admission | None = None,
        places: CheckpointPlaces | None = None,
        ack_checkpoint: Callable[[Execution, str], Awaitable[None]] | None = None,
        journal: DegradationJournal | None = None,
        unpublished: int = 0,
        on_transition: Callable[[str], None] | None = None,
    ) -> None:
        self.record = record
        self.driver = driver
        self.sink = sink
        self.executions = executions
        self.readiness = readiness
        self.on_route_change = on_route_change
        self.timings = timings
        self.execution = execution
        self.admission = admission
        self.places = places or CheckpointPlaces(node=record.node or "")
        self.pause_gate: PauseGate | None = None
        self.ack_checkpoint = ack_checkpoint
        self.checkpoint_requests: dict[str, PendingCheckpoint] = {}
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._exit_watch: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._restart_timer: asyncio.Task[None] | None = None
        # True while the current execution may take data-plane traffic (ready, not being retired).
        self.serving = False
        # True while a result is done locally and its commit is retried in memory (NOD-7; no journal entry).
        self.commit_retrying = False
        self.journal = journal
        self.on_transition = on_transition
        # JRN-3: how many of this Environment's results wait in the degradation journal; while any does, later
        # results are journaled behind them, never committed ahead of them.
        self.unpublished = unpublished
        self._replay_queued = False
        # NOD-10/NOD-11: a journaled result the Coordinator refused; only this Controller waits for the routine
        # check to bring the authority's record.
        self.restricted = False
        # NOD-10: the newest network revision the running execution cannot take in place (no veth); its next
        # start or resume applies it, so the routine check does not ask the runtime again every round.
        self.network_deferred_revision = 0
        # The Coordinator retired this Environment's placement before anything ran here (the node forgets it).
        self.retired = False
        # NOD-12: a newer generation took this Environment over; this Controller only cleaned its execution.
        self.revoked = False
        self.closed = False

    # -- public ------------------------------------------------------------------------------------
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

    def request_replay(self) -> None:
        """Queue one replay of this Environment's journaled results (NOD-17: in its own queue; NOD-4: at most
        one pending)."""
        if self.unpublished and not self._replay_queued and not self.closed_for_good:
            self._replay_queued = True
            self.submit(Replay())

    async def drained(self) -> None:
        """Wait until every operation admitted so far has run (a barrier's drain, NOD-1/NOD-6)."""
        if self.closed_for_good:
            return
        marker = self.submit(Noop())
        await asyncio.shield(marker)

    @property
    def closed_for_good(self) -> bool:
        return self._task is None or self._task.done()

    def start_task(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"controller-{self.env_id}")

    async def close(self) -> None:
        """Stop the task (not the execution: a node shutdown leaves workloads running)."""
        self.closed = True
        for task in (self._exit_watch, self._restart_timer, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def adopt_running(self) -> None:
        """After a node restart: take over a running execution (routes, exit watch) without touching it."""
        if self.execution is None or self.record.state is not S.RUNNING:
            raise ConflictError(f"environment {self.env_id}: nothing running to adopt")
        self.serving = True
        self._spawn(self._publish_route(), f"route-{self.env_id}")
        self._watch_exit(self.execution)
        log.info("adopted running execution", extra=self._context())

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def submit(self, operation: Operation) -> asyncio.Future[EnvironmentRecord]:
        queued = _Queued(operation, asyncio.get_running_loop().create_future())
        # Many submitters never await the result (routine checks, timers): the failure is logged by _run.
        queued.done.add_done_callback(_mark_retrieved)
        self._queue.put_nowait(queued)
        return queued.done

    # -- the serial loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            queued = await self._queue.get()
            op = queued.operation
            try:
                if self.revoked and not isinstance(op, Noop | Revoke):
                    # NOD-12: nothing that arrives after the revocation acts on the old ownership.
                    raise ConflictError(f"environment {self.env_id}: generation {self.record.generation} was revoked")
                result = await self._dispatch(op)
            except asyncio.CancelledError:
                if not queued.done.done():
                    queued.done.set_exception(UnavailableError(f"environment {self.env_id}: controller stopped"))
                raise
            except AdxError as exc:
                log.warning("operation %s failed: %s", op.kind, exc, extra=self._context())
                if not queued.done.done():
                    queued.done.set_exception(exc)
                continue
            except Exception as exc:
                log.exception("operation %s crashed", op.kind, extra=self._context())
                if not queued.done.done():
                    queued.done.set_exception(exc)
                continue
            if not queued.done.done():
                queued.done.set_result(result)

    async def _dispatch(self, op: Operation) -> EnvironmentRecord:
        match op:
            case Start():
                return await self._start()
            case ContinueStart():
                return await self._continue_start()
            case FinishStart():
                return await self._finish_start()
            case Delete(record=record):
                return await self._delete(record)
            case Exited(execution_id=execution_id, info=info):
                return await self._exited(execution_id, info)
            case Restart():
                return await self._restart()
            case Pause(auto=auto):
                return await self._pause(auto)
            case CancelPause():
                return await self._recover_pausing()
            case Resume(record=record):
                return await self._resume(record)
            case ResumeLocal():
                return await self._resume_local()
            case WorkloadCheckpoint(operation_id=operation_id):
                return await self._workload_checkpoint(operation_id)
            case Snapshot(operation_id=operation_id, result=result):
                return await self._snapshot(operation_id, result)
            case Replay():
                return await self._replay()
            case Noop():
                return self.record
            case Revoke():
                return await self._revoke()
            case After(prior=prior):
                return await self._after(prior)
            case Adopt(record=record):
                return await self._adopt(record)
            case SetNetwork(record=record):
                return await self._set_network(record)

    def _context(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "execution_id": self.execution.execution_id if self.execution else self.record.execution_id,
            "generation": self.record.generation,
            "state": self.record.state.value,
        }

    async def _transition(
        self,
        target: EnvironmentState,
        changes: dict[str, Any] | None = None,
        *,
        release: bool = False,
        retry: bool = True,
    ) -> EnvironmentRecord:
        """Check, commit (with retries while the Coordinator is unavailable, unless ``retry`` is False: the
        caller keeps its own deadline) and log one transition."""
        current = self.record.state
        if current != target:
            check_transition(current, target, env_id=self.env_id)
        update = {"state": target, **(changes or {})}
        retry_delay = Backoff(self.timings.retry_min_seconds, self.timings.retry_max_seconds)
        adopted = False
        journaled = False
        while True:
            if self.unpublished:
                # JRN-3: behind a journaled result, every later one is journaled too, in order.
                committed = await self._journal_result(update, release)
                if committed is not None:
                    journaled = True
                    break
                # The journal refuses writes: publish what it holds if the Coordinator is back, then commit.
                await self._publish_journaled()
                if self.unpublished:
                    await retry_delay.sleep()
                continue
            try:
                committed = await self.sink.commit(self.record, update, release_reservation=release)
                break
            except SessionRejectedError as exc:
                # NOD-6: not a verdict on this result: the node registers again and the commit is retried.
                self.commit_retrying = True
                log.warning(
                    "commit of %s waits for the node's new session: %s", target.value, exc, extra=self._context()
                )
                await retry_delay.sleep()
                continue
            except ConflictError:
                # The Coordinator may have changed fields this node does not own (a lifetime deadline, a
                # resume-retry mark): if ownership, state and execution are unchanged, go on from its version
                # (NOD-10: compare published state and revision, never flag such an update as a conflict).
                latest = None if adopted else await self._latest_or_none()
                if latest is None or not self._same_ownership(latest):
                    raise
                self.record, adopted = latest, True
            except (UnavailableError, UncertainOutcomeError) as exc:
                if not retry:
                    raise
                # JRN-2: only an unavailable Coordinator degrades, and only a stored entry counts as journaled.
                if self.journal is not None and self.journal.configured:
                    committed = await self._journal_result(update, release)
                    if committed is not None:
                        journaled = True
                        break
                # NOD-7: the result stays pending here and is retried on this Controller's own deadline.
                self.commit_retrying = True
                log.warning("commit of %s pending: %s", target.value, exc, extra=self._context())
                await retry_delay.sleep()
                latest = await self._latest_or_none()
                if latest is not None and latest.revision > self.record.revision:
                    # An uncertain commit may have landed: continue from what the authority holds.
                    self.record = latest
                    if latest.state == target:
                        committed = latest
                        break
        self.commit_retrying = False
        previous = self.record
        self.record = committed
        if committed.state is S.RUNNING and committed.network_revision > committed.network_applied_revision:
            # NOD-10: the commit met a policy stored meanwhile (adopted above): apply it in place now, after this.
            self.submit(SetNetwork(committed))
        if self.on_transition is not None:
            self.on_transition(self.env_id)
        log.info(
            "environment %s: %s -> %s%s",
            self.env_id,
            previous.state.value,
            committed.state.value,
            " (journaled: publication pending)" if journaled else "",
            extra={**self._context(), "revision": committed.revision},
        )
        return committed

    async def _journal_result(self, update: dict[str, Any], release: bool) -> EnvironmentRecord | None:
        """Store this result in the degradation journal and go on from it as the local record (JRN-2, JRN-3).
        None when the journal could not store it (the caller keeps it pending in memory: never "journaled")."""
        if self.journal is None or not self.journal.configured:
            return None
        base = self.record
        local = EnvironmentRecord.model_validate(
            {**base.model_dump(), **update, "revision": base.revision + 1, "updated_at": time.time()}
        )
        try:
            await self.journal.append(
                NewResult(
                    env_id=self.env_id,
                    generation=base.generation,
                    base_revision=base.revision,
                    base_state=base.state,
                    base_execution_id=base.execution_id,
                    state=local.state,
                    execution_id=local.execution_id,
                    changes=wire_changes(base, update),
                    release_reservation=release,
                    spec_digest=spec_digest(base.spec),
                )
            )
        except UnavailableError as exc:
            log.error("result not journaled, kept pending in memory: %s", exc, extra=self._context())
            return None
        self.unpublished += 1
        return local

    async def _replay(self) -> EnvironmentRecord:
        """NOD-17/JRN-5: publish this Environment's journaled results, in order, from its own queue."""
        self._replay_queued = False
        return await self._publish_journaled()

    async def _publish_journaled(self) -> EnvironmentRecord:
        if self.journal is None or not self.unpublished:
            return self.record
        entries = await self.journal.pending(self.env_id)
        outcome = await replay(self.journal, self.sink, self.record.node or "", entries, self.sink.fetch)
        self.unpublished = outcome.remaining
        if outcome.end is ReplayEnd.DROPPED:
            # NOD-10/NOD-11: the authority disagrees; only this Controller waits for the routine check.
            self.restricted = True
        elif (
            outcome.end is ReplayEnd.DONE
            and outcome.record is not None
            and outcome.record.revision >= self.record.revision
        ):
            self.record = outcome.record
        log.info(
            "journal replay %s: %d committed, %d dropped, %d remaining",
            outcome.end.value,
            outcome.committed,
            outcome.dropped,
            outcome.remaining,
            extra=self._context(),
        )
        return self.record

    async def _finish_start(self) -> EnvironmentRecord:
        """After a node restart: the execution of a Starting record runs (the start returned, its Running commit
        was cut short). Adopt it once ready (never kill what runs); if it does not become ready, the start
        failed like any other (RST-7)."""
        execution = self.execution
        if self.record.state is not S.STARTING or execution is None:
            return self.record
        try:
            await self.readiness.wait_ready(execution, self.timings.ready_timeout_seconds)
        except AdxError as exc:
            return await self._start_failed(execution.execution_id, f"not ready after a node restart: {exc}")
        return await self._running(execution)

    async def _revoke(self) -> EnvironmentRecord:
        """NOD-12: the Coordinator gave this Environment a newer generation: behind every operation admitted
        before, retire the routes and clean this generation's execution (confirmed), then refuse everything."""
        self.serving = False
        if self._restart_timer is not None:
            self._restart_timer.cancel()
        if self._exit_watch is not None:
            self._exit_watch.cancel()
        execution, self.execution = self.execution, None
        if execution is not None:
            await self._cleanup(execution)
        self.revoked = True
        log.info("generation revoked: its execution is cleaned", extra=self._context())
        return self.record

    async def _after(self, prior: asyncio.Future[EnvironmentRecord]) -> EnvironmentRecord:
        """Wait for another Controller's operation (the revoked generation's cleanup, RST-5) before going on."""
        with contextlib.suppress(Exception):
            await asyncio.shield(prior)
        return self.record

    async def _adopt(self, incoming: EnvironmentRecord) -> EnvironmentRecord:
        """NOD-10: the authoritative check a restricted Controller waits for: its record is adopted when it
        describes what this node really runs (same generation and execution)."""
        local_execution = self.execution.execution_id if self.execution is not None else None
        if (
            self.restricted
            and incoming.generation == self.record.generation
            and incoming.execution_id == local_execution
        ):
            self.record = incoming
            self.restricted = False
            log.info("authoritative record adopted", extra=self._context())
        elif self.restricted:
            log.warning(
                "still restricted: the Coordinator holds %s/%s, this node runs %s",
                incoming.state.value,
                incoming.execution_id,
                local_execution,
                extra=self._context(),
            )
        return self.record

    async def _set_network(self, incoming: EnvironmentRecord) -> EnvironmentRecord:
        """NOD-10: the Coordinator stored a new network policy (a mutable spec field). Only a record newer than
        ours with the same ownership, state and execution is taken, or ours when it holds a policy not applied
        yet; an old catalog copy is no conflict and changes nothing. A running execution gets the policy in
        place, then its revision is published; a paused one takes the record and gets the policy when it
        resumes."""
        if incoming.revision <= self.record.revision:
            # Ours is as new (a commit adopted the policy without applying it) or newer: it holds every policy
            # stored up to its revision, so apply from it and never go back to an older copy.
            incoming = self.record
        elif not self._same_ownership(incoming):
            return self.record
        if incoming.network_revision <= max(self.record.network_applied_revision, self.network_deferred_revision):
            return self.record
        previous, self.record = self.record, incoming
        execution = self.execution
        if self.state is not S.RUNNING or execution is None or incoming.spec.network is None:
            return self.record
        try:
            await self.driver.set_network(execution, incoming.spec.network)
        except ConflictError:
            # Not changeable in place (no veth): the record stays; the next start or resume applies it.
            self.network_deferred_revision = incoming.network_revision
            raise
        except AdxError:
            self.record = previous  # e.g. sandboxd unavailable: the next routine check tries again
            raise
        log.info("network policy applied", extra={**self._context(), "revision": incoming.network_revision})
        return await self._transition(S.RUNNING, {"network_applied_revision": incoming.network_revision})

    def _same_ownership(self, other: EnvironmentRecord) -> bool:
        mine = self.record
        return (other.node, other.generation, other.state, other.execution_id) == (
            mine.node,
            mine.generation,
            mine.state,
            mine.execution_id,
        ) and other.revision > mine.revision

    async def _latest_or_none(self) -> EnvironmentRecord | None:
        try:
            return await self.sink.fetch(self.env_id)
        except AdxError:
            return None

    async def _retry_until_done(self, what: str, action: Callable[[], Awaitable[None]]) -> None:
        """Cleanup must be confirmed: retry with 1-32 s backoff (MET-6) until the runtime confirms."""
        retry_delay = Backoff(self.timings.retry_min_seconds, self.timings.retry_max_seconds)
        while True:
            try:
                await action()
                return
            except NotFoundError:
                return
            except AdxError as exc:
                log.warning("%s not confirmed yet: %s", what, exc, extra=self._context())
                await retry_delay.sleep()

    # -- operations --------------------------------------------------------------------------------
    async def _start(self) -> EnvironmentRecord:
        if self.record.state is not S.PENDING:
            raise ConflictError(f"environment {self.env_id} is {self.record.state.value}, not pending")
        execution_id = new_id("exe")
        try:
            await self._transition(S.STARTING, {"execution_id": execution_id})
        except NotFoundError:
            # NOD-20: an explicit claim result: the Coordinator retired the placement before anything started
            # here (a create refused as retryable); nothing of it exists on this node.
            self.retired = True
            log.info("placement retired before the start: nothing started", extra=self._context())
            raise
        return await self._launch_started(execution_id)

    async def _launch_started(self, execution_id: str, secret: str | None = None) -> EnvironmentRecord:
        """Launch the execution a committed Starting record names, then Running or Failed. A record created from
        a snapshot names the snapshot's checkpoint: its first start restores it, and Running drops the reference
        (the snapshot's own catalog entry keeps the artifact)."""
        restore = self.record.checkpoint if self.record.state is S.STARTING else None
        try:
            execution = await self._launch(execution_id, secret=secret, restore=restore)
        except AdxError as exc:
            return await self._start_failed(execution_id, str(exc))
        return await self._running(execution, {"checkpoint": None} if restore is not None else None)

    async def _start_failed(self, execution_id: str, reason: str) -> EnvironmentRecord:
        # RST-7: a failed first start is Failed at once (see _fail_or_restart_later); cleanup of whatever it left
        # goes on afterwards.
        failed = await self._fail_or_restart_later(reason)
        leftover = await self._take_leftover(execution_id)
        if leftover is not None:
            self._spawn(self._cleanup(leftover), f"cleanup-{execution_id}")
        return failed

    async def _continue_start(self) -> EnvironmentRecord:
        """After a node restart: a Starting record whose execution never came up here, because the node stopped
        before asking the runtime (no planned address) or while the runtime was creating it (only planned). No
        start failed, so this is neither a failure nor a restart: the same create goes on under the same
        execution ID and secret (the runtime returns what it made), or under a new ID when the runtime already
        cleaned the interrupted one."""
        execution_id = self.record.execution_id
        if self.record.state is not S.STARTING or execution_id is None:
            return self.record
        if self.execution is not None and self.execution.execd_socket is not None:
            return self.record  # it had started: adopted elsewhere (finish_start)
        planned = self.execution or self.executions.get(execution_id)
        secret = str(planned.native["token"]) if planned is not None and "token" in planned.native else None
        self.execution = None
        log.info(
            "the start was cut short by a node stop (%s): it goes on under the same execution",
            "the runtime was creating it" if planned is not None else "before it reached the runtime",
            extra=self._context(),
        )
        try:
            execution = await self._launch(execution_id, secret=secret)
        except ConflictError as exc:
            if "was used before" not in exc.message:
                return await self._start_failed(execution_id, str(exc))
            # The interrupted create's sandbox was made and cleaned by the runtime meanwhile (it never reuses an
            # ID): nothing of that execution exists, so the first start goes on under a new execution ID.
            self.execution = None
            self.executions.forget(execution_id)
            fresh = new_id("exe")
            await self._transition(S.STARTING, {"execution_id": fresh})
            return await self._launch_started(fresh)
        except AdxError as exc:
            return await self._start_failed(execution_id, str(exc))
        return await self._running(execution)

    async def _launch(
        self, execution_id: str, *, restore: CheckpointRef | None = None, secret: str | None = None
    ) -> Execution:
        spec = ExecutionSpec(
            self.env_id, self.record.generation, execution_id, self.record.spec, tenant=self.record.tenant
        )
        if secret is not None:
            spec = dataclasses.replace(spec, secret=secret)  # the same call again: the runtime returns its result
        self.executions.save(self.driver.planned(spec))  # addressable even if this call's reply is lost
        execution = await self._call_runtime_until_up(spec, restore)
        self.executions.save(execution)
        self.execution = execution
        await self.readiness.wait_ready(execution, self.timings.ready_timeout_seconds)
        return execution

    async def _call_runtime_until_up(self, spec: ExecutionSpec, restore: CheckpointRef | None) -> Execution:
        """Start or restore, retried while the runtime is unreachable or restarting, up to the readiness budget:
        an infrastructure blip never fails a user's create. Repeating the call is safe: the execution ID and its
        secret are the caller's, so the runtime returns the execution a lost reply had created."""
        deadline = time.monotonic() + self.timings.ready_timeout_seconds
        retry_delay = Backoff(0.1, 2.0)
        while True:
            try:
                if restore is None:
                    return await self.driver.start(spec)
                return await self.driver.restore(spec, self.places.locate(restore), restore.digest)
            except (UnavailableError, UncertainOutcomeError) as exc:
                if time.monotonic() + retry_delay.peek() > deadline:
                    raise
                log.warning("runtime not answering, the start is retried: %s", exc, extra=self._context())
                await retry_delay.sleep()

    async def _running(self, execution: Execution, changes: dict[str, Any] | None = None) -> EnvironmentRecord:
        # Serve before the Coordinator announces Running: a client that sees the commit may call at once.
        self.serving = True
        try:
            # Every start, restart and resume applies the spec's network policy: publish its revision.
            applied = {"network_applied_revision": self.record.network_revision}
            running = await self._transition(S.RUNNING, {**applied, **(changes or {})})
        except BaseException:
            self.serving = False
            raise
        await self._publish_route()
        self._watch_exit(execution)
        return running

    async def _fail_or_restart_later(self, reason: str) -> EnvironmentRecord:
        """Failed; with a restart policy that allows another attempt, a restart is pending after its backoff
        (RST-2). The reservation stays while a restart is pending and is released only at the final failure.

        RST-7: a first start that never came up (its launch failed, its execution ended before it ran, or a node
        restart cut it short) is Failed at once and never restarted."""
        if self.record.state is S.STARTING and self.record.restart_attempts == 0:
            return await self._transition(
                S.FAILED, {"last_error": f"start failed: {reason}", "restart_pending": False}, release=True
            )
        policy = self.record.spec.lifecycle.restart_policy
        attempts = self.record.restart_attempts
        if policy is not None and policy.allows(attempts):
            failed = await self._transition(S.FAILED, {"last_error": reason, "restart_pending": True})
            self.schedule_pending_restart()
            return failed
        return await self._transition(S.FAILED, {"last_error": reason, "restart_pending": False}, release=True)

    def schedule_pending_restart(self) -> None:
        """Arm the backoff timer of a committed pending restart (also after a node restart: RST-3)."""
        policy = self.record.spec.lifecycle.restart_policy
        if policy is None or not self.record.restart_pending or self.record.state is not S.FAILED:
            return
        delay = policy.backoff_seconds(self.record.restart_attempts + 1)
        log.info("restart %d pending in %.1fs", self.record.restart_attempts + 1, delay, extra=self._context())

        async def later() -> None:
            await asyncio.sleep(delay)
            self.submit(Restart())

        if self._restart_timer is not None:
            self._restart_timer.cancel()
        self._restart_timer = asyncio.create_task(later(), name=f"restart-timer-{self.env_id}")

    async def _restart(self) -> EnvironmentRecord:
        if self.record.state is not S.FAILED or not self.record.restart_pending:
            return self.record  # deleted or replaced meanwhile (RST-4)
        execution_id = new_id("exe")
        # RST-2: a new execution ID; the same Environment ID and ownership generation.
        await self._transition(
            S.STARTING,
            {
                "execution_id": execution_id,
                "restart_attempts": self.record.restart_attempts + 1,
                "restart_pending": False,
            },
        )
        try:
            execution = await self._launch(execution_id)
        except AdxError as exc:
            leftover = await self._take_leftover(execution_id)
            if leftover is not None:
                # RST-5: no replacement starts while the old one's cleanup is unconfirmed.
                await self._cleanup(leftover)
            return await self._fail_or_restart_later(f"restart failed: {exc}")
        return await self._running(execution)

    async def _take_leftover(self, execution_id: str) -> Execution | None:
        """After a failed launch: whatever it may have left in the runtime (its recorded address, planned before
        the call), now owned by cleanup."""
        leftover = self.execution or self.executions.get(execution_id)
        self.execution = None
        return leftover

    async def _cleanup(self, execution: Execution) -> None:
        await self._retry_until_done(f"cleanup of {execution.execution_id}", lambda: self.driver.stop(execution))
        self.executions.forget(execution.execution_id)

    def _watch_exit(self, execution: Execution) -> None:
        async def watch() -> None:
            while True:
                try:
                    info = await self.driver.wait_exit(execution)
                    break
                except (UnavailableError, UncertainOutcomeError) as exc:
                    # CTL-4: a runtime that restarts (its long wait cut) is no evidence of an exit: wait again.
                    log.warning("waiting for exit: %s", exc, extra=self._context())
                    await asyncio.sleep(self.timings.retry_min_seconds)
                except AdxError:
                    info = ExitInfo(reason="the runtime lost the execution")
                    break
            self.submit(Exited(execution.execution_id, info))

        self._exit_watch = asyncio.create_task(watch(), name=f"exit-watch-{execution.execution_id}")

    async def _publish_route(self) -> None:
        if self.on_route_change is not None:
            await self.on_route_change(self.record, self.execution if self.record.state is S.RUNNING else None)

    async def _delete(self, incoming: EnvironmentRecord | None) -> EnvironmentRecord:
        if (
            incoming is not None
            and incoming.generation == self.record.generation
            and incoming.revision > self.record.revision
            and not self.publication_pending
        ):
            self.record = incoming  # NOD-12: the Coordinator's delete, adopted in order behind earlier operations
        if self.record.state is S.DELETED:
            return self.record
        self.serving = False
        if self._restart_timer is not None:
            self._restart_timer.cancel()  # RST-4: an explicit delete cancels a pending restart
        if self.record.state is not S.DELETING:
            await self._transition(S.DELETING)
        await self._publish_route()
        if self._exit_watch is not None:
            self._exit_watch.cancel()
        if self.execution is not None:
            await self._cleanup(self.execution)
            self.execution = None
        # CTL-6: the delete result is committed only after the runtime confirmed the cleanup.
        deleted = await self._transition(S.DELETED, release=True)
        self.closed = True
        return deleted

    async def _exited(self, exited_id: str, info: ExitInfo | None) -> EnvironmentRecord:
        execution = self.execution
        if execution is None or execution.execution_id != exited_id:
            return self.record  # a late notice of an execution this Controller no longer runs
        if self.record.state not in (S.RUNNING, S.STARTING, S.PAUSING):
            return self.record
        info = info or ExitInfo(reason="the execution ended while the node was away")
        log.info("execution exited: %s", info.describe(), extra=self._context())
        # RST-1: retire routes, confirm the old execution's cleanup, then mark Failed, in that order.
        self.serving = False
        if self.on_route_change is not None:
            await self.on_route_change(self.record, None)
        await self._cleanup(execution)
        self.execution = None
        return await self._fail_or_restart_later(info.describe())

    # -- pause and resume --------------------------------------------------------------------------
    def open_pause_gate(self) -> PauseGate:
        """Start a pause's demand gate before any admission closes, so no request falls between the two."""
        if self.pause_gate is None:
            self.pause_gate = PauseGate()
        return self.pause_gate

    def drop_pause_gate(self, serve: bool = True) -> None:
        if self.pause_gate is not None:
            self.pause_gate.settle(serve)
            self.pause_gate = None

    async def _pause(self, auto: bool) -> EnvironmentRecord:
        try:
            return await self._pause_steps(auto)
        except BaseException:
            # Whatever stopped the pause, an Environment that still serves must admit again.
            if self.serving and self.execution is not None and self.admission is not None:
                with contextlib.suppress(AdxError):
                    await self.admission.reopen_admission(self.env_id, self.execution)
            raise
        finally:
            self.drop_pause_gate(serve=self.serving)

    async def _pause_steps(self, auto: bool) -> EnvironmentRecord:
        if self.record.state is S.PAUSED:
            return self.record
        execution = self.execution
        if self.record.state is not S.RUNNING or execution is None:
            raise ConflictError(
                f"environment {self.env_id} is {self.record.state.value}; only a running Environment can be paused",
                details={"state": self.record.state.value},
            )
        options = self.record.spec.lifecycle.effective_pause_options
        kind, storage = self.places.resolve(options.storage)
        gate = self.open_pause_gate()
        if not auto and self.admission is not None:
            await self.admission.close_admission(self.env_id, execution)
        await self._transition(S.PAUSING)
        if gate.demand:
            # IDLE-6: demand that arrived before capture cancels the pause.
            return await self._cancel_pause(execution, None)
        # From here on, new demand queues behind the resume entry (EnsureRunning), served after the resume.
        self.serving = False
        gate.settle(serve=False)
        started = time.monotonic()
        try:
            artifact = await self.driver.checkpoint(execution, storage, float(options.timeout_seconds))
        except AdxError as exc:
            # A failed capture or publication never reports a paused Environment (ENV-3).
            await self._cancel_pause(execution, f"pause failed: {exc}")
            raise UnavailableError(f"pause of {self.env_id} failed: {exc}; it keeps running") from None
        checkpoint = self._checkpoint_ref(artifact, kind)
        if self._exit_watch is not None:
            self._exit_watch.cancel()
        try:
            # CTL-6: committed only after the runtime published the artifact; resources released with it.
            paused = await self._transition(S.PAUSED, {"checkpoint": checkpoint, "execution_id": None}, release=True)
        except ConflictError:
            # Deleted or taken over meanwhile: this artifact is referenced by nothing; the execution runs on
            # until the operation that won (a delete) cleans it.
            with contextlib.suppress(AdxError):
                await self.driver.delete_checkpoint(artifact.location, artifact.digest)
            with contextlib.suppress(AdxError):
                await self.driver.thaw(execution)
            self.serving = True
            self._watch_exit(execution)
            raise
        log.info(
            "paused: checkpoint %s (%d bytes) in %.3fs",
            artifact.checkpoint_id,
            artifact.size_bytes,
            time.monotonic() - started,
            extra=self._context(),
        )
        self.execution = None
        await self._publish_route()
        await self._cleanup(execution)
        if self.admission is not None:
            await self.admission.reopen_admission(self.env_id, execution)
        return paused

    async def _cancel_pause(self, execution: Execution, error: str | None) -> EnvironmentRecord:
        """Back to running: thaw, reopen both gates, commit; waiting requests are served (IDLE-6)."""
        await self._thaw_until_confirmed(execution)
        if self.admission is not None:
            await self.admission.reopen_admission(self.env_id, execution)
        self.serving = True
        if self.pause_gate is not None:
            self.pause_gate.settle(serve=True)
        log.info("pause cancelled: %s", error or "demand arrived before capture", extra=self._context())
        return await self._transition(S.RUNNING, {"last_error": error} if error else None)

    async def _thaw_until_confirmed(self, execution: Execution) -> None:
        """A cancelled pause may have frozen the execution before it failed (its freeze acknowledged, or its
        reply lost): it runs again only once the runtime confirms the thaw. Tried once, a thaw lost to a
        runtime restart left a frozen sandbox behind an Environment reported Running."""
        retry_delay = Backoff(self.timings.retry_min_seconds, self.timings.retry_max_seconds)
        while True:
            try:
                await self.driver.thaw(execution)
                return
            except (UnavailableError, UncertainOutcomeError) as exc:
                log.warning("thaw after a cancelled pause not confirmed yet: %s", exc, extra=self._context())
                await retry_delay.sleep()
            except AdxError as exc:
                # Gone or no longer pausable (exited meanwhile): nothing is frozen; the exit flow sees the rest.
                log.info("no thaw after the cancelled pause: %s", exc, extra=self._context())
                return

    def note_checkpoint_request(self, operation_id: str, execution_id: str) -> None:
        """CTL-7: a workload asked for a checkpoint; duplicates (every snapshot repeats it) change nothing."""
        if operation_id in self.checkpoint_requests:
            return
        budget = float(self.record.spec.lifecycle.effective_pause_options.timeout_seconds)
        self.checkpoint_requests[operation_id] = PendingCheckpoint(
            operation_id,
            execution_id,
            time.monotonic() + budget,
            retry_delay=Backoff(self.timings.retry_min_seconds, self.timings.retry_max_seconds),
        )
        self.submit(WorkloadCheckpoint(operation_id))

    async def _workload_checkpoint(self, operation_id: str) -> EnvironmentRecord:
        item = self.checkpoint_requests.get(operation_id)
        execution = self.execution
        if item is None:
            return self.record
        if execution is None or execution.execution_id != item.execution_id or self.record.state is not S.RUNNING:
            del self.checkpoint_requests[item.operation_id]  # its execution is gone: nothing to capture or ack
            return self.record
        if time.monotonic() > item.deadline:
            log.warning("checkpoint request %s expired", item.operation_id, extra=self._context())
            del self.checkpoint_requests[item.operation_id]
            return self.record
        try:
            if item.checkpoint is None:
                item.checkpoint = await self._capture_live(execution, f"checkpoint {item.operation_id}")
            if not item.committed:
                await self._transition(S.RUNNING, {"checkpoint": item.checkpoint}, retry=False)
                item.committed = True
            if self.ack_checkpoint is not None:
                await self.ack_checkpoint(execution, item.operation_id)
        except UncertainOutcomeError as exc:
            if item.checkpoint is None:
                # CTL-7: an uncertain capture goes to cleanup and failure.
                del self.checkpoint_requests[item.operation_id]
                info = ExitInfo(reason=f"workload checkpoint {item.operation_id} uncertain: {exc}")
                self.submit(Exited(execution.execution_id, info))
                return self.record
            self._retry_checkpoint_request(item, exc)
            return self.record
        except AdxError as exc:
            self._retry_checkpoint_request(item, exc)
            return self.record
        del self.checkpoint_requests[item.operation_id]
        log.info("workload checkpoint %s published", item.operation_id, extra=self._context())
        return self.record

    async def _capture_live(self, execution: Execution, label: str) -> CheckpointRef:
        options = self.record.spec.lifecycle.effective_pause_options
        kind, storage = self.places.resolve(options.storage)
        artifact = await self.driver.checkpoint(execution, storage, float(options.timeout_seconds))
        await self._retry_until_done(f"thaw after {label}", lambda: self.driver.thaw(execution))
        return self._checkpoint_ref(artifact, kind)

    async def _snapshot(self, operation_id: str, result: asyncio.Future[CheckpointRef]) -> EnvironmentRecord:
        """A snapshot's capture: WorkloadCheckpoint's freeze, capture and thaw, with the artifact handed to the
        caller instead of committed on the record (a later pause or resume must not retire it). A failed capture
        is the caller's error and the execution runs on: a snapshot never ends the sandbox it was asked of."""
        execution = self.execution
        if result.done():
            return self.record  # the caller gave up while it was queued: nothing to capture
        try:
            if execution is None or self.record.state is not S.RUNNING:
                raise ConflictError(
                    f"environment {self.env_id} is {self.record.state.value}, not running: it cannot be snapshotted"
                )
            checkpoint = await self._capture_live(execution, f"snapshot {operation_id}")
        except AdxError as exc:
            if execution is not None and self.record.state is S.RUNNING:
                with contextlib.suppress(AdxError):  # a capture that failed midway may have left it frozen
                    await self.driver.thaw(execution)
            if not result.done():
                result.set_exception(exc)
            return self.record
        if result.done():
            # The caller gave up (cancelled): nothing will reference the artifact, so it goes now (CRD-9's startup
            # sweep would find it otherwise).
            self._spawn(self.driver.delete_checkpoint(checkpoint.location, checkpoint.digest), f"drop-{operation_id}")
        else:
            result.set_result(checkpoint)
            log.info("snapshot %s captured: %s", operation_id, checkpoint.id, extra=self._context())
        return self.record

    def _retry_checkpoint_request(self, item: PendingCheckpoint, exc: AdxError) -> None:
        """CTL-7: retry on this Controller's own backoff, with no new notification, until the deadline."""
        log.warning("checkpoint request %s not done: %s", item.operation_id, exc, extra=self._context())
        delay = item.retry_delay.next()

        async def later() -> None:
            await asyncio.sleep(delay)
            self.submit(WorkloadCheckpoint(item.operation_id))

        self._spawn(later(), f"checkpoint-retry-{item.operation_id}")

    def _checkpoint_ref(self, artifact: Artifact, kind: str) -> CheckpointRef:
        published = time.time()
        ttl = self.record.spec.lifecycle.effective_pause_options.retention.ttl_seconds
        return CheckpointRef(
            id=artifact.checkpoint_id,
            storage="shared" if kind == "shared" else "local",
            node=self.places.node,
            location=artifact.location,
            digest=artifact.digest,
            size_bytes=artifact.size_bytes,
            published_at=published,
            # ENV-3: the TTL counts from publication; forever has no expiry.
            expires_at=published + ttl if ttl is not None else None,
        )

    async def _recover_pausing(self) -> EnvironmentRecord:
        """After a node restart mid-pause (no published result): the execution runs on (NOD-1)."""
        execution = self.execution
        if self.record.state is not S.PAUSING or execution is None:
            return self.record
        running = await self._cancel_pause(execution, "the node restarted during the pause")
        self._watch_exit(execution)
        await self._publish_route()
        return running

    async def _resume_local(self) -> EnvironmentRecord:
        """Demand for an Environment whose pause is done here but not yet published (JRN-3, JRN-4): the cluster
        still has it running on this node under this generation, so this node resumes it itself and journals
        the resume behind the pause; both replay in order."""
        if self.record.state is S.RUNNING:
            return self.record
        if self.record.state is not S.PAUSED or not self.unpublished:
            raise EnvironmentPausedError(
                f"environment {self.env_id} is {self.record.state.value}; it resumes on demand"
            )
        await self._transition(S.RESUMING)
        return await self._resume(None)

    async def _resume(self, incoming: EnvironmentRecord | None) -> EnvironmentRecord:
        if incoming is not None and incoming.revision > self.record.revision:
            self.record = incoming
        if self.record.state is S.RUNNING:
            return self.record
        checkpoint = self.record.checkpoint
        if self.record.state is not S.RESUMING or checkpoint is None:
            raise ConflictError(
                f"environment {self.env_id} is {self.record.state.value}; nothing to resume",
                details={"state": self.record.state.value},
            )
        execution_id = new_id("exe")
        try:
            execution = await self._launch(execution_id, restore=checkpoint)
        except AdxError as exc:
            leftover = await self._take_leftover(execution_id)
            if leftover is not None:
                await self._cleanup(leftover)
            # No new execution exists: back to paused on the same checkpoint, reservation released.
            return await self._transition(
                S.PAUSED, {"resume_intent": None, "last_error": f"{RESUME_FAILED}: {exc}"}, release=True
            )
        # The checkpoint is no longer referenced once Running is committed: the catalog retires it (CRD-9).
        return await self._running(
            execution, {"execution_id": execution_id, "checkpoint": None, "resume_intent": None, "last_error": None}
        )


def _mark_retrieved(future: asyncio.Future[EnvironmentRecord]) -> None:
    if not future.cancelled():
        future.exception()
