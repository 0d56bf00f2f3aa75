"""The adxlet: registers with the Coordinator, runs one Controller per Environment it owns, serves the
node gRPC API and the Relay, and converges with the Coordinator's catalog every report period.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Collection
from pathlib import Path

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from adx._certs import Identity, component_paths
from adx._coordinator_channel import coordinator_channel
from adx._grpc_tls import channel_credentials, server_credentials
from adx._health import HealthServicer
from adx.config._node import AutoResourceSource, NodeConfig, SandboxdResourceSource
from adx.errors import (
    AdxError,
    ConflictError,
    EnvironmentPausedError,
    InvalidInputError,
    NotFoundError,
    PublicationPendingError,
    UnavailableError,
    VersionMismatchError,
)
from adx.model import DORMANT_STATES, EnvironmentRecord, EnvironmentState, Resources
from adx.node._checks import RuntimeChecks
from adx.node._controller import CheckpointPlaces, Controller, ControllerTimings, ReadinessProbe
from adx.node._convergence import CatalogConvergence
from adx.node._coordinator_client import CoordinatorSink
from adx.node._executions import ExecutionFiles
from adx.node._idle import IdleDetector
from adx.node._image_pull import ImagePuller
from adx.node._journal import DegradationJournal, PendingResult
from adx.node._logs import WorkloadLogs
from adx.node._metrics import MetricsSampler, NodeCollector, metrics_registry
from adx.node._operations import Delete, Pause, Resume, Step
from adx.node._pressure import PressureMonitor
from adx.node._relay import Relay, RelayServer, RelayTarget, serve_asgi, serve_relay
from adx.node._replay import ReplayOutcome
from adx.node._reporter import Reporter
from adx.node._resources import CapacityTracker, Reading, read_auto, read_capacity_file_devices
from adx.node._service import NodeService
from adx.node._snapshot_service import NodeSnapshotsService
from adx.node._watch import EnvironmentWatch
from adx.proto import coordinator_pb2_grpc, health_pb2_grpc, node_pb2_grpc, snapshots_pb2_grpc
from adx.runtime import Execution, InventoryItem
from adx.runtime._recording import RecordingDriver
from adx.runtime._sandboxd import ExecdReadiness, SandboxdDriver, SubscriptionReadiness
from adx.sandboxd import RuntimeControlSubscription

log = logging.getLogger("adx.node")

#: How long a stop waits for the node's loops and Controllers to end once cancelled.
STOP_SECONDS = 10.0
S = EnvironmentState
#: How long the start waits for the runtime-control stream's first snapshot (which carries its protocol).
RUNTIME_CONTROL_FIRST_SNAPSHOT_SECONDS = 10.0


class NodeAgent(CatalogConvergence, RuntimeChecks):
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.name = config.name
        self.paths = component_paths(config.certs_dir, Identity("node", config.name))
        self.driver = (
            RecordingDriver(config.state_dir)  # bench only: executions are recorded, nothing runs
            if config.runtime.bench_record_only
            else SandboxdDriver(
                config.runtime.socket, python=config.runtime.python, volumes_dir=config.runtime.volumes_dir
            )
        )
        self.readiness: ReadinessProbe = ExecdReadiness(self.driver)
        self.control: RuntimeControlSubscription | None = None
        self.executions = ExecutionFiles(config.state_dir / "executions")
        self.journal = DegradationJournal(config.degradation_journal)
        # NOD-13: executions whose cleanup is not confirmed yet (their files are the persisted records).
        self._orphans: dict[str, Execution] = {}
        # NOD-1: executions the runtime holds that this node cannot address (seen at the last recovery).
        self.unaddressable: list[InventoryItem] = []
        self._journaled_at_start: list[PendingResult] = []
        self._dropped_at_start: dict[str, ReplayOutcome] = {}
        self._converging: set[str] = set()
        self.controllers: dict[str, Controller] = {}
        # Recently deleted Environments (monotonic time of removal), so late data-plane calls get "not running".
        self._deleted: dict[str, float] = {}
        self.relay = Relay(self._relay_target, admission_wait=self._pause_decision, prepare=self._resume_unpublished)
        self.places = CheckpointPlaces(
            node=config.name,
            default_storage=config.checkpoints.default_storage,
            shared_root=config.checkpoints.shared_root,
        )
        self.idle = IdleDetector(lambda: self.control.states if self.control is not None else {}, self.relay.streams)
        self.metrics = MetricsSampler(
            self.driver,
            lambda: self.controllers,
            node=config.name,
            interval=config.metrics_interval_seconds,
            call_timeout=config.rpc_timeout_seconds,
        )
        self._metrics_server: RelayServer | None = None
        # MET-5: the workload output of every Environment held here (and of unconfirmed cleanups) is kept.
        self.logs = WorkloadLogs(
            self.driver,
            lambda: {*self.controllers, *self._orphan_envs()},
            node=config.name,
            interval=config.report_interval_seconds,
        )
        # CTL-2/CTL-4: each Environment's runtime checks run on its own task, woken by its own events.
        self.watch = EnvironmentWatch(
            self._check_environment, self._sandbox_owner, safety_interval=config.idle_check_interval_seconds
        )
        self._sandbox_owners: dict[str, str] = {}
        self._watching = False  # set once startup recovery is done: watches start with serving
        self.relay.streams.on_change = self.watch.wake
        self.health = HealthServicer("node")
        self.stop_event = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._server: grpc.aio.Server | None = None
        self._relay_server: RelayServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._disconnected: dict[str, float] = {}  # env -> when its execd observation disappeared (CTL-5)
        self._ended: dict[str, str] = {}  # env -> execution handed to the exit flow by the runtime watch
        self.reporter: Reporter
        self.images: ImagePuller
        self.sink: CoordinatorSink
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        # NOD-17/JRN-7: a journal left by the previous process is read first; a corrupt one stops the start.
        self._journaled_at_start = self.journal.open_existing()
        if self._journaled_at_start:
            log.warning(
                "degradation journal holds %d unpublished results; they replay once the Coordinator answers",
                len(self._journaled_at_start),
                extra={"node": self.name, "path": str(self.journal.path)},
            )
        await self._wait_runtime()
        await self._find_shared_storage()
        # CTL-2: ONE runtime-control subscription per node; Controllers take Ready from it (pushed).
        self.control = await self.driver.subscribe()
        try:
            await self.control.wait_connected(within=RUNTIME_CONTROL_FIRST_SNAPSHOT_SECONDS)
        except VersionMismatchError:
            await self.control.close()  # CTL-8: this node does not run beside a runtime of another version
            raise
        except UnavailableError as exc:
            # sandboxd answered its health check a moment ago: a slow first snapshot is a blip, not a refusal.
            log.warning("runtime control not connected yet, going on: %s", exc, extra={"node": self.name})
        self.readiness = SubscriptionReadiness(self.driver, self.control)
        credentials = channel_credentials(self.paths)
        # Issue 13: an image this node's store lacks is pulled from a node that has it before a start mounts it.
        self.images = ImagePuller(self.name, credentials, self._image_store, lambda: self.sink.peers())
        self.driver.ensure_image = self.images.ensure
        self._channel = coordinator_channel(self.config.coordinator, credentials)
        stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        # Listen first: the advertised addresses are part of the registration.
        self._server = grpc.aio.server()
        node_pb2_grpc.add_NodeServicer_to_server(NodeService(self), self._server)
        snapshots_pb2_grpc.add_NodeSnapshotsServicer_to_server(NodeSnapshotsService(self), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        try:
            self.port = self._server.add_secure_port(self.config.listen, server_credentials(self.paths))
        except RuntimeError as exc:
            raise UnavailableError(f"node: cannot listen on {self.config.listen}: {exc}") from None
        self._relay_server = await serve_relay(self.relay, self.config.relay_listen, self.paths)
        host = self.config.listen.rpartition(":")[0] or "127.0.0.1"
        relay_host = self.config.relay_listen.rpartition(":")[0] or "127.0.0.1"
        self.reporter = Reporter(
            stub,
            node=self.name,
            address=self.config.advertise_address or f"{host}:{self.port}",
            relay_address=f"{relay_host}:{self._relay_server.port}",
            tracker=self._capacity_tracker(),
            interval=self.config.report_interval_seconds,
            rpc_timeout=self.config.rpc_timeout_seconds,
            checkpoint_capable=self.driver.capabilities().can_checkpoint,
            shared_storage=self.places.shared_root is not None,
            pressure=PressureMonitor(self.config.pressure, self._sandbox_disk_path),
            cpu_overcommit=self.config.cpu_overcommit,
        )
        self.sink = CoordinatorSink(
            stub,
            self.name,
            lambda: self.reporter.state.session,
            self.config.rpc_timeout_seconds,
        )
        # NOD-1: inside the startup barrier (nothing is served yet) recover from catalog + inventory.
        await self._register_and_recover()
        await self._server.start()
        self.health.set_serving()
        self._tasks.append(asyncio.create_task(self._report_loop(), name="report-loop"))
        if self.control is not None:
            self._tasks.append(asyncio.create_task(self.watch.follow(self.control), name="runtime-events"))
        self._watching = True
        for env_id in list(self.controllers):
            self.watch.watch(env_id)
        self._tasks.append(asyncio.create_task(self.metrics.run(self.stop_event), name="metrics-loop"))
        self._tasks.append(asyncio.create_task(self.logs.run(self.stop_event), name="log-reclaim"))  # MET-5
        if self.config.metrics_listen:
            self._metrics_server = await serve_asgi(self._metrics_app(), self.config.metrics_listen, None, "metrics")
        log.info("node serving", extra={"node": self.name, "port": self.port, "relay": self.reporter.relay_address})

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_server.port if self._metrics_server is not None else None

    def _metrics_app(self) -> Starlette:
        registry = metrics_registry(
            NodeCollector(
                self.metrics,
                lambda: self.reporter.admission_open,
                lambda: self.relay.streams.closed_admission,
                capacity=lambda: sample.capacity if (sample := self.reporter.tracker.sample) else None,
                cpu_overcommit=self.config.cpu_overcommit,
            )
        )

        async def metrics(request: Request) -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

        return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])

    async def stop(self) -> None:
        """Stop serving; executions keep running (a node restart adopts them)."""
        self.stop_event.set()
        self.health.set_not_serving("stopping")
        for task in self._tasks:
            task.cancel()
        # A loop that died of an error, or one that does not end when cancelled, must not keep the servers
        # below from stopping: a stop is bounded, and what did not end is named with where it was.
        await self._await_bounded(self._tasks, "node loop")
        await self.watch.aclose()
        if self._server is not None:
            await self._server.stop(grace=2)
        if self._relay_server is not None:
            await self._relay_server.stop()
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        await self.relay.aclose()
        if self.control is not None:
            await self.control.close()
        closing = [asyncio.create_task(c.close(), name=f"close-{c.env_id}") for c in self.controllers.values()]
        await self._await_bounded(closing, "Controller close")
        if self._channel is not None:
            await self._channel.close(None)
        await self.driver.aclose()

    async def _await_bounded(self, tasks: Collection[asyncio.Task[None]], what: str) -> None:
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=STOP_SECONDS)
        for task in done:
            if not task.cancelled() and (error := task.exception()) is not None:
                log.warning("%s %s had failed before the stop: %r", what, task.get_name(), error)
        for task in pending:
            where = "".join(f"{frame.f_code.co_filename}:{frame.f_lineno} " for frame in task.get_stack(limit=8))
            log.error(
                "%s %s did not end within %gs of the stop; left behind (at %s)",
                what,
                task.get_name(),
                STOP_SECONDS,
                where.strip(),
                extra={"node": self.name},
            )

    async def _find_shared_storage(self) -> None:
        """Where this host mounts the shared checkpoint storage; a name the runtime lacks is a configuration
        error (NOD-19: it stops the start at once)."""
        name = self.places.shared_root
        if name is None:
            return
        roots = await self.driver.checkpoint_roots()
        if name not in roots:
            raise InvalidInputError(
                "checkpoints.shared_root", f"the runtime has no checkpoint storage {name!r} (it has {sorted(roots)})"
            )
        self.places = dataclasses.replace(self.places, shared_path=roots[name])

    async def _wait_runtime(self) -> None:
        """NOD-19: wait for the runtime, round after round, before registering or serving anything."""
        while True:
            deadline = time.monotonic() + self.config.runtime_ready_timeout_seconds
            last = ""
            while time.monotonic() < deadline:
                try:
                    await self.driver.health()
                    return
                except AdxError as exc:
                    last = str(exc)
                await asyncio.sleep(0.2)
            log.warning("runtime not ready: %s; waiting another round", last, extra={"node": self.name})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), self.config.report_interval_seconds)
            if self.stop_event.is_set():
                raise UnavailableError("node stopped before its runtime became ready")

    def _capacity_tracker(self) -> CapacityTracker:
        source = self.config.effective_resource_source
        valid_for = source.valid_for_seconds if source is not None else self.config.capacity_file_valid_for_seconds

        async def read() -> Resources | Reading:
            if isinstance(source, SandboxdResourceSource):
                try:
                    await self.driver.health()
                    return Reading(*await self.driver.resources_and_devices())
                except AdxError as exc:
                    raise UnavailableError(f"sandboxd resources: {exc}") from None
            if isinstance(source, AutoResourceSource):
                return await asyncio.to_thread(read_auto, source.disk_path)
            assert self.config.capacity_file is not None
            return await asyncio.to_thread(read_capacity_file_devices, self.config.capacity_file)

        return CapacityTracker(read, valid_for)

    async def _image_store(self) -> Path | None:
        return (await self.driver.storage()).image_store

    async def _sandbox_disk_path(self) -> Path:
        """RES-7: disk pressure is measured on the filesystem holding sandboxd's state directory."""
        try:
            path = (await self.driver.storage()).state_dir
        except AdxError as exc:
            raise UnavailableError(f"sandboxd's state directory: {exc}") from None
        if path is None:
            raise UnavailableError("sandboxd's health names no state directory; set pressure.disk_path")
        return path

    # -- routine checks -------------------------------------------------------------------------
    def _controller(self, record: EnvironmentRecord, execution: Execution | None = None) -> Controller:
        controller = self.controllers.get(record.id)
        if controller is None:
            controller = Controller(
                record,
                driver=self.driver,
                sink=self.sink,
                executions=self.executions,
                readiness=self.readiness,
                timings=ControllerTimings(ready_timeout_seconds=self.config.runtime.ready_timeout_seconds),
                execution=execution,
                admission=self,
                places=self.places,
                ack_checkpoint=self._ack_checkpoint,
                journal=self.journal,
                on_transition=self.watch.wake,
            )
            controller.start_task()
            self.controllers[record.id] = controller
            if self._watching:
                self.watch.watch(record.id)
        return controller

    async def _report_loop(self) -> None:
        """NOD-2/NOD-4: heartbeat and capacity every period on this task alone; the routine check runs as its
        own task, waited for at most one period (never cancelled, at most one at a time), so a slow catalog,
        admission close or checkpoint deletion never delays a heartbeat."""
        routine: asyncio.Task[None] | None = None
        while not self.stop_event.is_set():
            started = time.monotonic()
            was_registered = self.reporter.state.session
            await self.reporter.report_once()
            if self.reporter.state.registered and self.reporter.state.coordinator_reachable:
                # NOD-17: each Controller replays its journaled results in its own queue (no global lock).
                for controller in list(self.controllers.values()):
                    controller.request_replay()
            if self.reporter.state.retake_pending and self.reporter.state.registered:
                # NOD-6: a new handshake after an explicit rejection: the barrier runs before admission opens.
                if routine is not None and not routine.done():
                    await asyncio.wait([routine], timeout=self.config.report_interval_seconds)
                if routine is None or routine.done():
                    routine = asyncio.create_task(self._retake(was_registered), name="session-retake")
            elif routine is None or routine.done():
                routine = asyncio.create_task(self._routine_check_logged(), name="routine-check")
            remaining = max(self.config.report_interval_seconds - (time.monotonic() - started), 0.0)
            await asyncio.wait([routine], timeout=remaining)
            delay = max(self.config.report_interval_seconds - (time.monotonic() - started), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), timeout=delay)
        if routine is not None and not routine.done():
            routine.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await routine

    # -- requests ----------------------------------------------------------------------------------
    def admit(self, record: EnvironmentRecord) -> EnvironmentRecord:
        if record.node != self.name:
            raise InvalidInputError("environment.node", f"placed on {record.node}, not on this node ({self.name})")
        existing = self.controllers.get(record.id)
        if existing is not None:
            return existing.record
        if record.state is not S.PENDING:
            raise ConflictError(f"environment {record.id} is {record.state.value}, not pending")
        if not self.reporter.admission_open:
            # Temporary (Coordinator unreachable, capacity sample expired, a session re-take in progress): the
            # caller retries or leaves it Pending for this node's routine check; never a failed create.
            raise UnavailableError(
                f"node {self.name} is not admitting new Environments now ({self.reporter.closed_reason}); retry shortly"
            )
        if record.id in self._orphan_envs():
            raise UnavailableError(f"environment {record.id}: an earlier execution's cleanup is not confirmed yet")
        controller = self._controller(record)
        controller.submit(Step.START)
        return controller.record

    def delete(self, record: EnvironmentRecord) -> EnvironmentRecord:
        if record.node != self.name:
            raise NotFoundError(f"environment {record.id} is not on node {self.name}")
        controller = self.controllers.get(record.id) or self._controller(record)
        if controller.record.revision < record.revision:
            controller.record = record
        # The Coordinator's Deleting record goes with it: adopted in the queue even when the local record is past
        # it (a result the Coordinator never stored), so the delete is not refused as stale.
        controller.submit(Delete(record))
        return controller.record

    async def pause(self, record: EnvironmentRecord, within: float) -> EnvironmentRecord:
        controller = self._owned_controller(record)
        done = controller.submit(Pause())
        deadline = time.monotonic() + within
        while not done.done():
            if controller.commit_retrying:
                raise self._publication_pending(controller, "pause")
            if time.monotonic() > deadline:
                raise UnavailableError(f"pause of {record.id} not finished within {within:g}s; it goes on")
            await asyncio.wait([done], timeout=0.05)
        paused = done.result()
        if controller.publication_pending:
            raise self._publication_pending(controller, "pause")
        return paused

    def _publication_pending(self, controller: Controller, what: str) -> PublicationPendingError:
        """ENV-6/JRN-4: done on this node, not yet stored by the cluster: never reported as a success."""
        journaled = controller.unpublished > 0
        if journaled:
            progress = f"is done on node {self.name} and kept in its degradation journal"
        else:
            progress = f"goes on on node {self.name}, its progress kept in the node's memory"
        return PublicationPendingError(
            f"temporarily unavailable: cluster publication pending (the {what} of {controller.env_id} {progress} "
            "until the Coordinator can store it)",
            details={"journaled": journaled, "state": controller.state.value},
        )

    def resume(self, record: EnvironmentRecord) -> EnvironmentRecord:
        if record.state is not S.RESUMING:
            raise ConflictError(f"environment {record.id} is {record.state.value}, not resuming")
        controller = self._owned_controller(record)
        controller.submit(Resume(record))
        return record

    def owned_controller(self, record: EnvironmentRecord) -> Controller:
        """The Controller of an Environment the Coordinator placed here (NotFoundError for another node's)."""
        return self._owned_controller(record)

    def _owned_controller(self, record: EnvironmentRecord) -> Controller:
        if record.node != self.name:
            raise NotFoundError(f"environment {record.id} is not on node {self.name}")
        controller = self.controllers.get(record.id)
        if controller is not None and controller.record.generation < record.generation:
            return self._take_over(controller, record)
        return controller if controller is not None else self._controller(record)

    def _relay_target(self, env_id: str) -> RelayTarget:
        controller = self.controllers.get(env_id)
        if controller is None and not self._watching:
            # Startup recovery has not rebuilt this node's Environments yet: "not here" would be a false answer.
            raise UnavailableError(f"node {self.name} is recovering after a restart; retry shortly")
        if controller is None:
            if env_id in self._deleted:
                # Data-plane callers holding a cached route learn "deleted", not "never existed here".
                raise ConflictError(f"environment {env_id} is deleted, not running")
            raise NotFoundError(f"environment {env_id} is not on node {self.name}")
        execution = controller.execution
        if controller.state in DORMANT_STATES and not controller.serving:
            raise EnvironmentPausedError(f"environment {env_id} is {controller.state.value}; it resumes on demand")
        if not controller.serving or execution is None or execution.execd_socket is None:
            raise ConflictError(f"environment {env_id} is {controller.state.value}, not running")
        return RelayTarget(env_id, execution.execd_socket, lambda: self.driver.network_namespace(execution))
