"""A Controller's checkpoints: pause (with its demand gate, IDLE-6), a cancelled pause, and the live captures a
workload (CTL-7) or a snapshot asks for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from adx._backoff import Backoff
from adx.errors import AdxError, ConflictError, UnavailableError, UncertainOutcomeError
from adx.model import CheckpointRef, EnvironmentRecord
from adx.node._controller_core import PauseGate, PendingCheckpoint, S, log
from adx.node._controller_execution import ExecutionSteps
from adx.node._operations import Exited, WorkloadCheckpoint
from adx.runtime import Artifact, Execution, ExitInfo


class PauseSteps(ExecutionSteps):
    """Pause, a cancelled pause, and live captures (workload checkpoints, snapshots)."""

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

    async def _recover_pausing(self) -> EnvironmentRecord:
        """After a node restart mid-pause (no published result): the execution runs on (NOD-1)."""
        execution = self.execution
        if self.record.state is not S.PAUSING or execution is None:
            return self.record
        running = await self._cancel_pause(execution, "the node restarted during the pause")
        self._watch_exit(execution)
        await self._publish_route()
        return running

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
