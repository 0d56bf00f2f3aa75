"""Each Environment's runtime checks, run on its own watch task (CTL-2, CTL-4): execd disconnects and probe
failures (CTL-5, RST-6), workload checkpoint requests (CTL-7), the idle window and its reclaim (IDLE-1..6), and
the two admission gates in front of an execution (the Controller's Admission protocol).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from adx._backoff import Backoff
from adx.errors import AdxError, UnavailableError
from adx.model import EnvironmentState, IdleAction
from adx.node._operations import Delete, Exited, Pause, Step
from adx.runtime import Execution, ExecutionState, ExitInfo

if TYPE_CHECKING:
    from adx.node._controller import Controller
    from adx.node._idle import IdleDetector
    from adx.node._relay import Relay
    from adx.node._watch import EnvironmentWatch
    from adx.runtime._sandboxd import SandboxdDriver
    from adx.sandboxd import RuntimeControlSubscription

log = logging.getLogger("adx.node")

#: How long a reopened gate keeps asking an unconnected runtime-control subscription (a sandboxd restarting).
REOPEN_ADMISSION_SECONDS = 30.0
S = EnvironmentState

#: CTL-5: the execd reconnect window without a health threshold (with one: threshold x this).
DISCONNECT_WINDOW_SECONDS = 5.0
#: How long a request that met a pause's closed admission waits for the pause's decision (IDLE-6).
PAUSE_DECISION_WAIT_SECONDS = 10.0
#: How long a request waits for the local resume of an Environment whose pause is not published (JRN-4).
LOCAL_RESUME_WAIT_SECONDS = 30.0


class RuntimeChecks:
    """The runtime checks and admission gates of :class:`adx.node._agent.NodeAgent` (a mixin: the state it uses
    is the agent's)."""

    driver: SandboxdDriver
    controllers: dict[str, Controller]
    control: RuntimeControlSubscription | None
    idle: IdleDetector
    relay: Relay
    watch: EnvironmentWatch
    _sandbox_owners: dict[str, str]
    _disconnected: dict[str, float]
    _ended: dict[str, str]

    async def _check_environment(self, env_id: str) -> float | None:
        """One Environment's runtime checks, on its own watch task (CTL-2/CTL-4); the seconds until its next
        deadline (None: nothing is due)."""
        controller = self.controllers.get(env_id)
        if controller is None:
            self.watch.unwatch(env_id)
            return None
        runtime_due = await self._check_runtime(controller)
        idle_due = await self._check_idle(controller)
        due = [d for d in (runtime_due, idle_due) if d is not None]
        return min(due) if due else None

    def _sandbox_owner(self, sandbox_id: str) -> str | None:
        owner = self._sandbox_owners.get(sandbox_id)
        if owner is not None and owner in self.controllers:
            return owner
        self._sandbox_owners = {
            str(c.execution.native["sandbox_id"]): env_id
            for env_id, c in self.controllers.items()
            if c.execution is not None
        }
        return self._sandbox_owners.get(sandbox_id)

    async def _check_runtime(self, controller: Controller) -> float | None:
        """CTL-5 (execd disconnects), RST-6 (probe failures) and CTL-7 (workload checkpoint requests), from
        the runtime-control stream. Returns the seconds until a pending disconnect confirmation is due."""
        execution = controller.execution
        if controller.state is not S.RUNNING or execution is None or not controller.serving or self.control is None:
            self._disconnected.pop(controller.env_id, None)
            return None
        if self._ended.get(controller.env_id) == execution.execution_id:
            return None  # already handed to the exit flow
        lifecycle = controller.record.spec.lifecycle
        threshold = lifecycle.execd_health_failure_threshold
        observed = self.control.states.get(str(execution.native["sandbox_id"]))
        now = time.monotonic()
        if observed is None:
            since = self._disconnected.setdefault(controller.env_id, now)
            window = threshold * DISCONNECT_WINDOW_SECONDS if threshold else DISCONNECT_WINDOW_SECONDS
            if now - since < window:
                return window - (now - since)
            state = await self.driver.observe(execution)
            if state in (ExecutionState.EXITED, ExecutionState.MISSING):
                self._end(controller, execution, f"execd disconnected and the execution {state.value}")
            elif threshold is not None and state is ExecutionState.RUNNING:
                self._end(controller, execution, f"execd unreachable for {window:g}s (threshold {threshold})")
            else:
                self._disconnected[controller.env_id] = now  # a live backend keeps waiting: confirm again later
                return window
            return None
        self._disconnected.pop(controller.env_id, None)  # CTL-5: a reconnect cancels the pending confirmation
        if observed.refused is not None:
            self._end(controller, execution, observed.refused)  # CTL-8: never served half-understood
            return None
        probe = observed.probe
        if threshold is not None and probe is not None and not probe.ok and probe.consecutive_failures >= threshold:
            self._end(controller, execution, f"health probe failed {probe.consecutive_failures} times: {probe.reason}")
            return None
        for request in observed.checkpoint_requests:
            controller.note_checkpoint_request(request.operation_id, execution.execution_id)
        return None

    def _end(self, controller: Controller, execution: Execution, reason: str) -> None:
        """Hand an execution to its Controller's exit flow: routes retired, cleanup confirmed, then Failed or a
        restart (RST-1, RST-6)."""
        log.warning("ending execution: %s", reason, extra={"env_id": controller.env_id})
        self._ended[controller.env_id] = execution.execution_id
        self._disconnected.pop(controller.env_id, None)
        controller.submit(Exited(execution.execution_id, ExitInfo(reason=reason)))

    async def _ack_checkpoint(self, execution: Execution, operation_id: str) -> None:
        if self.control is None:
            raise UnavailableError("no runtime-control subscription to acknowledge the checkpoint on")
        await self.control.ack_checkpoint(str(execution.native["sandbox_id"]), operation_id)

    async def _check_idle(self, controller: Controller) -> float | None:
        """IDLE-1..6 for one Environment; returns the seconds until its idle window ends (None: not running)."""
        lifecycle = controller.record.spec.lifecycle
        execution = controller.execution
        if lifecycle.idle_timeout_seconds <= 0 or controller.state is not S.RUNNING or execution is None:
            self.idle.forget(controller.env_id)  # IDLE-1: 0 never reclaims
            return None
        sandbox_id = str(execution.native["sandbox_id"])
        idle_for = self.idle.idle_for(controller.env_id, sandbox_id)
        if idle_for < lifecycle.idle_timeout_seconds:
            # Re-checked at the window's end, or earlier when the stream or the Relay reports a change.
            return lifecycle.idle_timeout_seconds - idle_for if self.idle.quiet_key(controller.env_id) else None
        pausing = lifecycle.idle_action is IdleAction.PAUSE
        gate = controller.open_pause_gate() if pausing else None
        if not await self._close_admission_if_unchanged(controller.env_id, sandbox_id):
            controller.drop_pause_gate()
            return None  # demand arrived at the last moment: the window starts again
        self.idle.forget(controller.env_id)
        if gate is not None:
            # IDLE-6: both gates are closed; demand that meets them from now on is recorded by the gate, and
            # the pause re-checks it before capture.
            log.info("idle for %ss: pausing", lifecycle.idle_timeout_seconds, extra={"env_id": controller.env_id})
            controller.submit(Pause(auto=True))
            return None
        log.info("idle for %ss: deleting", lifecycle.idle_timeout_seconds, extra={"env_id": controller.env_id})
        controller.submit(Delete())
        return None

    async def _close_admission_if_unchanged(self, env_id: str, sandbox_id: str) -> bool:
        """Close the Relay's, then execd's admission, each only if its activity version did not move
        (IDLE-6 order); reopen the Relay's if execd's moved."""
        key = self.idle.quiet_key(env_id)
        if key is None or self.control is None:
            return False
        if not self.relay.streams.close_admission(env_id, key.relay_version):
            self.idle.forget(env_id)
            return False
        result = await self.control.close_admission(sandbox_id, key.execd_version)
        if not result.ok:
            self.relay.streams.open_admission(env_id)
            self.idle.forget(env_id)
            return False
        return True

    # -- the admission gates (Controller's Admission protocol) -----------------------------------------
    async def close_admission(self, env_id: str, execution: Execution) -> None:
        """Close both gates whatever the activity (a manual pause): the Relay's, then execd's."""
        self.relay.streams.closed_admission.add(env_id)
        if self.control is None:
            return
        sandbox_id = str(execution.native["sandbox_id"])
        for _ in range(5):
            observed = self.control.states.get(sandbox_id)
            if observed is None:
                return  # no execd connection: nothing reaches it anyway
            if (await self.control.close_admission(sandbox_id, observed.activity.version)).ok:
                return
            await asyncio.sleep(0.01)

    async def reopen_admission(self, env_id: str, execution: Execution) -> None:
        """Open both gates again. execd's stays closed until it hears so, and after a sandboxd restart (a pause cut
        short by it) the runtime-control subscription reconnects only after a moment: an unconnected one is
        retried with backoff for up to REOPEN_ADMISSION_SECONDS, so a thawed Environment does not keep refusing
        every command as "pausing". Any other refusal (the sandbox is gone) ends it."""
        self.relay.streams.open_admission(env_id)
        if self.control is None:
            return
        sandbox_id = str(execution.native["sandbox_id"])
        deadline = time.monotonic() + REOPEN_ADMISSION_SECONDS
        backoff = Backoff(0.05, 1.0)
        while True:
            try:
                await self.control.open_admission(sandbox_id)
                return
            except UnavailableError as exc:
                if time.monotonic() + backoff.peek() > deadline:
                    log.warning("execd's admission of %s stays closed: %s", sandbox_id, exc, extra={"env_id": env_id})
                    return
                await backoff.sleep()
            except AdxError:
                return

    async def _resume_unpublished(self, env_id: str) -> None:
        """Demand for an Environment paused here whose pause the cluster has not stored yet (the Coordinator was
        away): the cluster still routes it here, so this node resumes it and journals the resume (JRN-3/4)."""
        controller = self.controllers.get(env_id)
        if controller is None or controller.state is not S.PAUSED or not controller.unpublished:
            return
        done = controller.submit(Step.RESUME_LOCAL)
        with contextlib.suppress(AdxError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(done), LOCAL_RESUME_WAIT_SECONDS)

    async def _pause_decision(self, env_id: str) -> bool:
        controller = self.controllers.get(env_id)
        gate = controller.pause_gate if controller is not None else None
        if gate is None:
            return False
        return await gate.wait(PAUSE_DECISION_WAIT_SECONDS)
