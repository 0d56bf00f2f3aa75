"""A Controller converging to the Coordinator's record after its journaled results were refused for good
(NOD-10, NOD-11, JRN-5).

The replay dropped them (a delete accepted meanwhile, a changed spec, ownership gone) and the Controller adopted
the authority's record at once (``CommitSteps._adopt_after_drop``). What those results did on this node is still
real: an execution the authority does not name, a checkpoint nothing published references. This step, queued
behind whatever was admitted before, makes the node match the record: what the record does not reference is
cleaned, a pause that really happened is published again on the record, and the record's own state is followed
(a `deleting` one is deleted; one naming an execution this node no longer runs goes through the exit flow).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from adx.errors import ConflictError
from adx.model import CheckpointRef, EnvironmentRecord
from adx.node._controller_core import DroppedResults, S, log
from adx.node._controller_failure import FailureSteps
from adx.node._operations import Delete


class ConvergeSteps(FailureSteps):
    """Step.CONVERGE: the node made to match the authority's record after a dropped replay."""

    async def _converge(self) -> EnvironmentRecord:
        dropped, self.dropped = self.dropped, None
        if dropped is None:
            return self.record
        if not dropped.adopted:
            return await self._converge_retired(dropped)
        if self._paused_here_unknown_there(dropped):
            await self._publish_pause_again(dropped)
        execution = self.execution
        if execution is not None and execution.execution_id != self.record.execution_id:
            # Started by a dropped result (a local resume, a restart): no committed record references it.
            self.serving = False
            if self._exit_watch is not None:
                self._exit_watch.cancel()
            self.execution = None
            await self._publish_route()
            await self._cleanup(execution)
        await self._delete_unreferenced(dropped.checkpoints)
        record = self.record
        if record.state is S.DELETING:
            if not self.deletes_queued:
                self.submit(Delete(record))  # the Coordinator's delete, in this queue (NOD-12)
            return record
        if (
            record.state in (S.RUNNING, S.STARTING, S.PAUSING)
            and record.execution_id is not None
            and self.execution is None
        ):
            # The record names an execution a dropped result already ended and cleaned here (RST-1).
            self.serving = False
            await self._publish_route()
            return await self._fail_or_restart_later(
                f"execution {record.execution_id} ended on node {self.places.node} while the Coordinator was "
                "away, and that result was refused"
            )
        return record

    def _paused_here_unknown_there(self, dropped: DroppedResults) -> bool:
        """A pause really happened here (its checkpoint kept) while the authority still shows the Environment
        running: the pause is the truth, published again on the authority's record. Its execution is gone, or,
        after a node restart, is still the one the record names: the adxlet stopped after the `paused` result
        was journaled and before that execution's cleanup was confirmed (its file kept). That execution is then
        cleaned below like any the record no longer names; its checkpoint is never the part given up."""
        checkpoint = dropped.local.checkpoint
        execution = self.execution
        return (
            dropped.local.state is S.PAUSED
            and checkpoint is not None
            and (execution is None or execution.execution_id == self.record.execution_id)
            and self.record.state is S.RUNNING
            and (self.record.checkpoint is None or self.record.checkpoint.id != checkpoint.id)
        )

    async def _publish_pause_again(self, dropped: DroppedResults) -> None:
        checkpoint = dropped.local.checkpoint
        assert checkpoint is not None
        try:
            await self._transition(S.PAUSING)
            # CTL-6: the artifact was published by the runtime before the first (dropped) commit.
            await self._transition(S.PAUSED, {"checkpoint": checkpoint, "execution_id": None}, release=True)
        except ConflictError as exc:
            log.warning("the dropped pause cannot be published again: %s", exc, extra=self._context())
            return
        log.info("the dropped pause published again: checkpoint %s", checkpoint.id, extra=self._context())

    async def _converge_retired(self, dropped: DroppedResults) -> EnvironmentRecord:
        """The ownership is gone (no record for this node) or moved on to a newer generation."""
        authority = dropped.authority
        if authority is not None and authority.node == self.record.node:
            # A newer generation here: the routine check's take-over cleans this one's execution (NOD-12).
            await self._delete_unreferenced(dropped.checkpoints)
            return self.record
        execution, self.execution = self.execution, None
        self.serving = False
        if self._exit_watch is not None:
            self._exit_watch.cancel()
        if self.on_route_change is not None:
            await self.on_route_change(self.record, None)
        if execution is not None:
            await self._cleanup(execution)
        await self._delete_unreferenced(dropped.checkpoints)
        self.retired = True  # the routine check forgets this Controller
        log.warning(
            "journaled results of a retired ownership dropped; what they left is cleaned", extra=self._context()
        )
        return self.record

    async def _delete_unreferenced(self, checkpoints: tuple[CheckpointRef, ...]) -> None:
        """The dropped results' artifacts the record does not reference: nothing else ever will (they were never
        published, so neither the Coordinator's retirement nor CRD-9 knows them; NOD-15)."""
        kept = self.record.checkpoint.id if self.record.checkpoint is not None else None
        for ref in {ref.id: ref for ref in checkpoints if ref.id != kept}.values():
            await self._retry_until_done(f"deletion of checkpoint {ref.id}", self._deletion_of(ref))
            log.info("checkpoint of a dropped result deleted: %s", ref.id, extra=self._context())

    def _deletion_of(self, ref: CheckpointRef) -> Callable[[], Awaitable[None]]:
        return lambda: self.driver.delete_checkpoint(self.places.locate(ref), ref.digest)
