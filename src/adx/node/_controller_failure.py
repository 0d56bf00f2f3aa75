"""A Controller's failures: an execution that exits, a start that fails, and the restart policy's pending
restart after its backoff (RST-1..RST-7).
"""

from __future__ import annotations

import asyncio

from adx.errors import AdxError
from adx.model import EnvironmentRecord, new_id
from adx.node._controller_core import S, log
from adx.node._controller_execution import ExecutionSteps
from adx.node._operations import Step
from adx.runtime import ExitInfo


class FailureSteps(ExecutionSteps):
    """Exits, failed starts and pending restarts (RST-*)."""

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
            self.submit(Step.RESTART)

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
