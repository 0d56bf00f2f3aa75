"""A Controller's calls to the runtime around one execution: launch (retried while the runtime is away), the
Running commit, the exit watch, route publication and confirmed cleanup (MET-6 backoff).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

from adx._backoff import Backoff
from adx.errors import AdxError, NotFoundError, UnavailableError, UncertainOutcomeError
from adx.model import CheckpointRef, EnvironmentRecord
from adx.model._records import RecordChanges
from adx.node._controller_commit import CommitSteps
from adx.node._controller_core import S, log
from adx.node._operations import Exited
from adx.runtime import Execution, ExecutionSpec, ExitInfo


class ExecutionSteps(CommitSteps):
    """The runtime calls around one execution, shared by start, resume, pause, failure and delete."""

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

    async def _running(self, execution: Execution, changes: RecordChanges | None = None) -> EnvironmentRecord:
        # Serve before the Coordinator announces Running: a client that sees the commit may call at once.
        self.serving = True
        try:
            # Every start, restart and resume applies the spec's network policy: publish its revision.
            applied: RecordChanges = {"network_applied_revision": self.record.network_revision}
            running = await self._transition(S.RUNNING, {**applied, **(changes or {})})
        except BaseException:
            self.serving = False
            raise
        await self._publish_route()
        self._watch_exit(execution)
        return running

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
