"""A Controller's starts: the first start, the starts a node restart cut short, and resume from a checkpoint."""

from __future__ import annotations

from adx.errors import AdxError, ConflictError, EnvironmentPausedError, NotFoundError
from adx.model import RESUME_FAILED, EnvironmentRecord, new_id
from adx.node._controller_core import S, log
from adx.node._controller_failure import FailureSteps


class StartSteps(FailureSteps):
    """First starts, interrupted starts, and resumes from a checkpoint."""

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
