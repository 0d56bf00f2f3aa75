"""One Controller per Environment: an asyncio task with its own queue and an explicit state machine.

A Controller never blocks another (NOD-4): each owns its queue and runs its operations serially. Every
state change is committed to the Coordinator (compare-and-set on revision and generation) through a
``ResultSink``; every transition is logged with the Environment ID, execution ID and generation.

The state table is ``adx.model.check_transition``; the dispatch below names every operation and the step that
runs it. The steps are in ``_controller_*`` modules, one idea each.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from adx.errors import AdxError, ConflictError, UnavailableError
from adx.model import EnvironmentRecord
from adx.node._controller_converge import ConvergeSteps
from adx.node._controller_core import (
    Admission,
    CheckpointPlaces,
    ControllerTimings,
    ExecutionStore,
    ReadinessProbe,
    ResultSink,
    S,
    log,
)
from adx.node._controller_delete import DeleteSteps
from adx.node._controller_network import NetworkSteps
from adx.node._controller_pause import PauseSteps
from adx.node._controller_start import StartSteps
from adx.node._operations import (
    Adopt,
    After,
    Delete,
    Exited,
    Operation,
    Pause,
    Resume,
    SetNetwork,
    Snapshot,
    Step,
    WorkloadCheckpoint,
)

# The Controller's constructor takes these contracts: importers find them beside it.
__all__ = [
    "Admission",
    "CheckpointPlaces",
    "Controller",
    "ControllerTimings",
    "ExecutionStore",
    "ReadinessProbe",
    "ResultSink",
]


class Controller(ConvergeSteps, StartSteps, PauseSteps, DeleteSteps, NetworkSteps):
    """One Environment's serial state machine: its queue, the loop that runs one operation at a time, and the
    dispatch from each operation to its step."""

    def request_replay(self) -> None:
        """Queue one replay of this Environment's journaled results (NOD-17: in its own queue; NOD-4: at most
        one pending)."""
        if self.unpublished and not self._replay_queued and not self.closed_for_good:
            self._replay_queued = True
            self.submit(Step.REPLAY)

    async def drained(self) -> None:
        """Wait until every operation admitted so far has run (a barrier's drain, NOD-1/NOD-6)."""
        if self.closed_for_good:
            return
        marker = self.submit(Step.NOOP)
        await asyncio.shield(marker)

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

    # -- the serial loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            queued = await self._queue.get()
            op = queued.operation
            try:
                if self.revoked and op not in (Step.NOOP, Step.REVOKE):
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
            finally:
                if isinstance(op, Delete):
                    self.deletes_queued -= 1
            if not queued.done.done():
                queued.done.set_result(result)

    async def _dispatch(self, op: Operation) -> EnvironmentRecord:
        match op:
            case Step():
                return await _STEPS[op](self)
            case Delete(record=record):
                return await self._delete(record)
            case Exited(execution_id=execution_id, info=info):
                return await self._exited(execution_id, info)
            case Pause(auto=auto):
                return await self._pause(auto)
            case Resume(record=record):
                return await self._resume(record)
            case WorkloadCheckpoint(operation_id=operation_id):
                return await self._workload_checkpoint(operation_id)
            case Snapshot(operation_id=operation_id, result=result):
                return await self._snapshot(operation_id, result)
            case After(prior=prior):
                return await self._after(prior)
            case Adopt(record=record):
                return await self._adopt(record)
            case SetNetwork(record=record):
                return await self._set_network(record)

    async def _barrier(self) -> EnvironmentRecord:
        return self.record


#: The step that runs each operation that needs nothing but its name.
_STEPS: dict[Step, Callable[[Controller], Awaitable[EnvironmentRecord]]] = {
    Step.START: Controller._start,
    Step.CONTINUE_START: Controller._continue_start,
    Step.FINISH_START: Controller._finish_start,
    Step.RESTART: Controller._restart,
    Step.CANCEL_PAUSE: Controller._recover_pausing,
    Step.RESUME_LOCAL: Controller._resume_local,
    Step.REPLAY: Controller._replay,
    Step.NOOP: Controller._barrier,
    Step.REVOKE: Controller._revoke,
    Step.CONVERGE: Controller._converge,
}
