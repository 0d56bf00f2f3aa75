"""BENCH ONLY: a runtime driver that records executions and runs nothing (``[runtime] bench_record_only``).

``bench/bench_control_plane.py`` runs many real adxlet processes against one Coordinator to measure the control
plane (placement, commits, InspectNode, Redis memory); sandboxes would cost each Environment ~9 MiB and a
create ~55 ms of CPU on this 2-core machine, which is what the bench must leave out. Every execution here is
"running" (and Ready) from its start until its stop, in this process's memory only: a restarted node finds none,
nothing is isolated, and the data plane (commands, ports, logs, checkpoints) is refused. Never configure it for
a node that serves Environments.

It subclasses :class:`SandboxdDriver` only for the node's sandboxd-shaped extras (runtime-control subscription,
resource reading, log groups): every method the node calls is overridden, and no sandboxd is ever asked.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from adx.errors import NotFoundError, UnavailableError
from adx.model import NetworkPolicy, Resources
from adx.runtime._driver import (
    Artifact,
    DriverCapabilities,
    Execution,
    ExecutionSpec,
    ExecutionState,
    ExecutionStats,
    ExitInfo,
    InventoryItem,
)
from adx.runtime._sandboxd import SandboxdDriver, SandboxdStorage
from adx.sandboxd import LogsRequest, LogsResponse, RuntimeControlSubscription
from adx.sandboxd._control_client import AdmissionResult, RuntimeControlEvent
from adx.sandboxd._models import ActivityObservation, RuntimeObservation

#: What a recorded execution is told about itself when the data plane is asked for (nothing runs).
NOTHING_RUNS = "the bench-only recording runtime runs nothing"
#: What a recording node reports when its capacity source is sandboxd: room for any bench (1000 CPUs, 1 PiB).
BENCH_CAPACITY = Resources(cpu_millis=1_000_000, memory_bytes=2**50, disk_bytes=2**50)
_READY = RuntimeObservation(
    ready=True, activity=ActivityObservation(version=0, active=0, background_running=0, admission_open=True)
)


@dataclass
class _Recorded:
    execution: Execution
    state: ExecutionState = ExecutionState.RUNNING
    stopped: asyncio.Event = field(default_factory=asyncio.Event)


class RecordedControl(RuntimeControlSubscription):
    """The runtime-control view of recorded executions: each is Ready from its start; no socket, no task."""

    def __init__(self) -> None:
        super().__init__("(recording)")
        self.connected = True

    def start(self) -> None:
        """Nothing to connect to."""

    async def close(self) -> None:
        self.connected = False

    async def wait_connected(self, within: float) -> None:
        return None

    def record(self, sandbox_id: str, observation: RuntimeObservation | None) -> None:
        if observation is None:
            self.states.pop(sandbox_id, None)
        else:
            self.states[sandbox_id] = observation
        self._emit(RuntimeControlEvent("delta", sandbox_id=sandbox_id, state=observation))

    async def close_admission(self, sandbox_id: str, expected_version: int) -> AdmissionResult:
        return AdmissionResult(ok=sandbox_id in self.states, version=expected_version, admission_open=False)

    async def open_admission(self, sandbox_id: str) -> AdmissionResult:
        return AdmissionResult(ok=sandbox_id in self.states, version=0, admission_open=True)

    async def ack_checkpoint(self, sandbox_id: str, operation_id: str) -> None:
        return None


class RecordingDriver(SandboxdDriver):
    """BENCH ONLY (see the module): executions are entries in a dict; ``capacity`` is what the node reports."""

    name = "recording"

    def __init__(self, state_dir: Path, capacity: Resources = BENCH_CAPACITY) -> None:
        # The base's client is never used (every call is overridden); its socket path names the mode.
        super().__init__(state_dir / "no-sandboxd.sock")
        self._state_dir = state_dir
        self.capacity = capacity
        self.recorded: dict[str, _Recorded] = {}
        self.control = RecordedControl()
        self.starts = 0
        self.stops = 0

    async def aclose(self) -> None:
        await self.control.close()

    async def health(self) -> None:
        return None

    def capabilities(self) -> DriverCapabilities:
        return DriverCapabilities()  # no checkpoints, no network isolation: nothing runs

    async def start(self, spec: ExecutionSpec) -> Execution:
        known = self.recorded.get(spec.execution_id)
        if known is not None:  # idempotent, as the protocol asks
            return known.execution
        planned = self.planned(spec)
        execution = Execution(
            spec.env_id,
            spec.generation,
            spec.execution_id,
            native=planned.native,
            # A path nothing listens on: the Relay's calls fail as for an execd that went away.
            execd_socket=self._state_dir / "recorded" / f"{spec.execution_id}.sock",
            started_at=time.time(),
        )
        self.recorded[spec.execution_id] = _Recorded(execution)
        self.starts += 1
        self.control.record(spec.execution_id, _READY)
        return execution

    async def restore(self, spec: ExecutionSpec, location: str, digest: str) -> Execution:
        raise UnavailableError(f"{NOTHING_RUNS}: no checkpoints to restore")

    async def observe(self, execution: Execution) -> ExecutionState:
        known = self.recorded.get(execution.execution_id)
        return known.state if known is not None else ExecutionState.MISSING

    async def wait_exit(self, execution: Execution) -> ExitInfo:
        known = self.recorded.get(execution.execution_id)
        if known is not None:
            await known.stopped.wait()
        return ExitInfo(reason="stopped")

    async def stop(self, execution: Execution) -> None:
        known = self.recorded.pop(execution.execution_id, None)
        if known is not None:
            known.state = ExecutionState.MISSING
            known.stopped.set()
            self.stops += 1
            self.control.record(execution.execution_id, None)

    async def inventory(self) -> list[InventoryItem]:
        return [
            InventoryItem(r.execution.execution_id, r.execution.env_id, r.execution.generation, r.state)
            for r in self.recorded.values()
        ]

    async def reclaim(self, item: InventoryItem, secret: str) -> Execution:
        known = self.recorded.get(item.execution_id)
        if known is None:
            raise NotFoundError(f"no recorded execution {item.execution_id}")
        return known.execution

    async def resources(self) -> Resources:
        return self.capacity

    async def resources_and_devices(self) -> tuple[Resources, tuple[str, ...]]:
        return self.capacity, ()

    async def checkpoint(self, execution: Execution, storage: str, within_seconds: float) -> Artifact:
        raise UnavailableError(f"{NOTHING_RUNS}: it takes no checkpoints")

    async def thaw(self, execution: Execution) -> None:
        return None

    async def delete_checkpoint(self, location: str, digest: str) -> None:
        return None

    async def stats(self, execution: Execution) -> ExecutionStats:
        return ExecutionStats(0.0, 0, 0, 0, 0, 0, 0, observed_at=time.time())

    async def checkpoint_roots(self) -> dict[str, str]:
        return {}

    async def list_checkpoints(self, storage: str) -> list[Artifact]:
        return []

    async def network_namespace(self, execution: Execution) -> Path:
        raise UnavailableError(f"{NOTHING_RUNS}: no network namespace")

    async def set_network(self, execution: Execution, policy: NetworkPolicy) -> None:
        return None

    async def subscribe(self) -> RuntimeControlSubscription:
        return self.control

    async def logs(self, request: LogsRequest) -> LogsResponse:
        return LogsResponse(lines=[], cursor="")

    async def log_groups(self) -> list[str]:
        return []

    async def delete_logs(self, group: str) -> None:
        return None

    async def storage(self) -> SandboxdStorage:
        """No image store; the node's own state directory: disk pressure (RES-7) still measures a real filesystem."""
        return SandboxdStorage(image_store=None, state_dir=self._state_dir)
