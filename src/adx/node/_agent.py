"""The adxlet: registers with the Coordinator, runs one Controller per Environment it owns, serves the
node gRPC API and the Relay, and converges with the Coordinator's catalog every report period.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from adx._certs import Identity, component_paths
from adx._grpc_errors import abort_with
from adx._grpc_tls import channel_credentials, require_peer, server_credentials
from adx._health import HealthServicer
from adx.config._node import AutoResourceSource, NodeConfig, SandboxdResourceSource
from adx.errors import (
    AdxError,
    ConflictError,
    EnvironmentPausedError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
)
from adx.model import DORMANT_STATES, EnvironmentRecord, EnvironmentState, IdleAction, Resources
from adx.node._controller import CheckpointPlaces, Controller, ControllerTimings, ReadinessProbe
from adx.node._coordinator_client import CoordinatorSink
from adx.node._executions import ExecutionFiles
from adx.node._idle import IdleDetector
from adx.node._metrics import MetricsSampler, NodeCollector, metrics_registry
from adx.node._relay import Relay, RelayServer, RelayTarget, serve_asgi, serve_relay
from adx.node._reporter import Reporter
from adx.node._resources import CapacityTracker, read_auto, read_capacity_file
from adx.proto import coordinator_pb2_grpc, health_pb2_grpc, node_pb2, node_pb2_grpc
from adx.runtime import Execution, ExecutionState, ExitInfo
from adx.runtime._sandboxd import ExecdReadiness, SandboxdDriver, SubscriptionReadiness
from adx.sandboxd import RuntimeControlSubscription

log = logging.getLogger("adx.node")
S = EnvironmentState
DELETED_MEMORY_SECONDS = 600.0

Context = grpc.aio.ServicerContext[object, object]
#: CTL-5: the execd reconnect window without a health threshold (with one: threshold x this).
DISCONNECT_WINDOW_SECONDS = 5.0
#: How long a request that met a pause's closed admission waits for the pause's decision (IDLE-6).
PAUSE_DECISION_WAIT_SECONDS = 10.0


class NodeAgent:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.name = config.name
        self.paths = component_paths(config.certs_dir, Identity("node", config.name))
        self.driver = SandboxdDriver(config.runtime.socket, python=config.runtime.python)
        self.readiness: ReadinessProbe = ExecdReadiness(self.driver)
        self.control: RuntimeControlSubscription | None = None
        self.executions = ExecutionFiles(config.state_dir / "executions")
        self.controllers: dict[str, Controller] = {}
        # Recently deleted Environments (monotonic time of removal), so late data-plane calls get "not running".
        self._deleted: dict[str, float] = {}
        self.relay = Relay(self._relay_target, admission_wait=self._pause_decision)
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
        self.sink: CoordinatorSink
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        await self._wait_runtime()
        await self._find_shared_storage()
        # CTL-2: ONE runtime-control subscription per node; Controllers take Ready from it (pushed).
        self.control = await self.driver.subscribe()
        self.readiness = SubscriptionReadiness(self.driver, self.control)
        credentials = channel_credentials(self.paths)
        self._channel = grpc.aio.secure_channel(self.config.coordinator, credentials)
        stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        # Listen first: the advertised addresses are part of the registration.
        self._server = grpc.aio.server()
        node_pb2_grpc.add_NodeServicer_to_server(NodeService(self), self._server)
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
        self._tasks.append(asyncio.create_task(self._idle_loop(), name="idle-loop"))
        self._tasks.append(asyncio.create_task(self.metrics.run(self.stop_event), name="metrics-loop"))
        if self.config.metrics_listen:
            self._metrics_server = await serve_asgi(self._metrics_app(), self.config.metrics_listen, None, "metrics")
        log.info("node serving", extra={"node": self.name, "port": self.port, "relay": self.reporter.relay_address})

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_server.port if self._metrics_server is not None else None

    def _metrics_app(self) -> Starlette:
        registry = metrics_registry(
            NodeCollector(
                self.metrics, lambda: self.reporter.admission_open, lambda: self.relay.streams.closed_admission
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
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.stop(grace=2)
        if self._relay_server is not None:
            await self._relay_server.stop()
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        await self.relay.aclose()
        if self.control is not None:
            await self.control.close()
        for controller in self.controllers.values():
            await controller.close()
        if self._channel is not None:
            await self._channel.close(None)
        await self.driver.aclose()

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

        async def read() -> Resources:
            if isinstance(source, SandboxdResourceSource):
                try:
                    await self.driver.health()
                    return await self.driver.resources()
                except AdxError as exc:
                    raise UnavailableError(f"sandboxd resources: {exc}") from None
            if isinstance(source, AutoResourceSource):
                return await asyncio.to_thread(read_auto, source.disk_path)
            assert self.config.capacity_file is not None
            return await asyncio.to_thread(read_capacity_file, self.config.capacity_file)

        return CapacityTracker(read, valid_for)

    # -- recovery and routine checks -----------------------------------------------------------------
    async def _register_and_recover(self) -> None:
        while True:
            await self.reporter.report_once()
            if self.reporter.state.registered:
                try:
                    catalog = await self.sink.catalog(with_references=True)
                    break
                except AdxError as exc:
                    log.warning("catalog not available yet: %s", exc, extra={"node": self.name})
            await asyncio.sleep(min(self.config.report_interval_seconds, 1.0))
        # Recorded before every start or restore (its planned address), so this covers what an interrupted
        # launch left in the runtime too.
        known = {execution.execution_id: execution for execution in self.executions.load_all()}
        referenced = {record.execution_id for record in catalog if record.execution_id}
        # CRD-7: executions no committed record references (a start or restore cut short before its commit)
        # are cleaned before any Controller resumes or starts anything; the catalog was read fully.
        for execution_id, execution in known.items():
            if execution_id not in referenced:
                log.info("cleaning an unreferenced execution", extra={"execution_id": execution_id})
                with contextlib.suppress(AdxError):
                    await self.driver.stop(execution)
                self.executions.forget(execution_id)
        for record in catalog:
            await self._recover(record, known.get(record.execution_id or ""))
        await self._sweep_checkpoints()

    async def _sweep_checkpoints(self) -> None:
        """NOD-15, inside the startup barrier: delete the artifacts this node's runtime captured that no
        Environment of the cluster references (a pause interrupted between capture and commit leaves one).

        Only whole artifacts of our own runtime are listed, so another node's capture in flight on shared
        storage is never touched; retired ones are left to the confirmed deletion of CRD-9."""
        if self.sink.referenced_checkpoints is None:
            log.warning("checkpoint sweep skipped: the Coordinator sent no reference list", extra={"node": self.name})
            return
        referenced = self.sink.referenced_checkpoints | {ref.id for ref in self.sink.retired_checkpoints}
        storages = ["local"] if self.places.shared_root is None else ["local", self.places.shared_root]
        for storage in storages:
            try:
                artifacts = await self.driver.list_checkpoints(storage)
            except AdxError as exc:
                log.warning("checkpoint sweep of %s skipped: %s", storage, exc, extra={"node": self.name})
                continue
            for artifact in artifacts:
                if artifact.checkpoint_id in referenced:
                    continue
                try:
                    await self.driver.delete_checkpoint(artifact.location, artifact.digest)
                except AdxError as exc:
                    log.warning(
                        "unreferenced checkpoint %s not deleted: %s",
                        artifact.checkpoint_id,
                        exc,
                        extra={"node": self.name},
                    )
                    continue
                log.info(
                    "unreferenced checkpoint deleted",
                    extra={"node": self.name, "checkpoint_id": artifact.checkpoint_id, "storage": storage},
                )

    async def _recover(self, record: EnvironmentRecord, execution: Execution | None) -> None:
        controller = self._controller(record, execution)
        if record.state is S.PENDING:
            controller.submit("start")
        elif record.state is S.DELETING:
            controller.submit("delete")
        elif record.state is S.FAILED and record.restart_pending:
            controller.schedule_pending_restart()  # RST-3: the counters came back with the record
        elif record.state is S.RESUMING:
            controller.submit("resume")  # a half-done restore left nothing referenced: it was cleaned above
        elif record.state in (S.RUNNING, S.STARTING, S.PAUSING) and execution is not None:
            if execution.execd_socket is None:
                # Only planned: the start was cut short before it returned. Whatever it made is cleaned by the
                # exit flow, then the Environment fails (or restarts, by its policy) like any lost start.
                info = ExitInfo(reason="the node stopped while the execution was starting")
                controller.submit("exited", execution_id=execution.execution_id, info=info)
                return
            state = await self.driver.observe(execution)
            if state is ExecutionState.PAUSED or (state is ExecutionState.RUNNING and record.state is S.PAUSING):
                controller.submit("cancel_pause")  # the pause was not published: the execution runs on
            elif state is ExecutionState.RUNNING:
                controller.adopt_running()
            else:
                controller.submit("exited", execution_id=execution.execution_id, info=None)

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
            )
            controller.start_task()
            self.controllers[record.id] = controller
        return controller

    async def _report_loop(self) -> None:
        while not self.stop_event.is_set():
            started = time.monotonic()
            await self.reporter.report_once()
            await self._routine_check()
            delay = max(self.config.report_interval_seconds - (time.monotonic() - started), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), timeout=delay)

    async def _routine_check(self) -> None:
        """NOD-3: compare ownership, state and revision with the catalog; converge through each queue."""
        try:
            catalog = await self.sink.catalog()
        except AdxError as exc:
            # NOD-6: a failed fetch is never an empty catalog; keep everything and retry next round.
            log.warning("routine check skipped: %s", exc, extra={"node": self.name})
            return
        owned = {record.id for record in catalog}
        for record in catalog:
            controller = self.controllers.get(record.id)
            if controller is None:
                if record.state is S.PENDING:
                    self._controller(record).submit("start")
                elif record.state is S.DELETING:
                    self._controller(record).submit("delete")
                elif record.state is S.RESUMING:
                    self._controller(record).submit("resume", record=record)
            elif record.state is S.DELETING and controller.state not in (S.DELETING, S.DELETED):
                controller.record = record
                controller.submit("delete")
            elif (
                record.state is S.RESUMING
                and controller.state in (S.PAUSED, S.RESUMING)
                and record.revision > controller.record.revision
            ):
                controller.submit("resume", record=record)  # a lost resume hand-over (CRD-5)
        now = time.monotonic()
        for env_id, controller in list(self.controllers.items()):
            gone = env_id not in owned and controller.state is S.PAUSED and controller.execution is None
            if controller.state is S.DELETED or gone:
                # ``gone``: a paused Environment deleted, expired or resumed elsewhere; nothing of it runs here.
                await controller.close()
                del self.controllers[env_id]
                self._deleted[env_id] = now
        for env_id, when in list(self._deleted.items()):
            if now - when > DELETED_MEMORY_SECONDS:
                del self._deleted[env_id]
        await self._delete_retired_checkpoints()

    async def _delete_retired_checkpoints(self) -> None:
        """CRD-9: delete artifacts the global catalog lists as unreferenced; a failure retries next round."""
        for ref in self.sink.retired_checkpoints:
            if ref.storage == "local" and ref.node != self.name:
                continue
            try:
                await self.driver.delete_checkpoint(self.places.locate(ref), ref.digest)
                await self.sink.confirm_checkpoint_deleted(ref.id)
            except AdxError as exc:
                log.warning("retired checkpoint %s not deleted yet: %s", ref.id, exc, extra={"node": self.name})
                continue
            log.info("retired checkpoint deleted", extra={"node": self.name, "checkpoint_id": ref.id})

    async def _idle_loop(self) -> None:
        while not self.stop_event.is_set():
            for controller in list(self.controllers.values()):
                try:
                    await self._check_runtime(controller)
                    await self._check_idle(controller)
                except AdxError as exc:
                    log.warning("idle check failed: %s", exc, extra={"env_id": controller.env_id})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), timeout=self.config.idle_check_interval_seconds)

    async def _check_runtime(self, controller: Controller) -> None:
        """CTL-5 (execd disconnects), RST-6 (probe failures) and CTL-7 (workload checkpoint requests), from
        the runtime-control stream."""
        execution = controller.execution
        if controller.state is not S.RUNNING or execution is None or not controller.serving or self.control is None:
            self._disconnected.pop(controller.env_id, None)
            return
        if self._ended.get(controller.env_id) == execution.execution_id:
            return  # already handed to the exit flow
        lifecycle = controller.record.spec.lifecycle
        threshold = lifecycle.execd_health_failure_threshold
        observed = self.control.states.get(str(execution.native["sandbox_id"]))
        now = time.monotonic()
        if observed is None:
            since = self._disconnected.setdefault(controller.env_id, now)
            window = threshold * DISCONNECT_WINDOW_SECONDS if threshold else DISCONNECT_WINDOW_SECONDS
            if now - since < window:
                return
            state = await self.driver.observe(execution)
            if state in (ExecutionState.EXITED, ExecutionState.MISSING):
                self._end(controller, execution, f"execd disconnected and the execution {state.value}")
            elif threshold is not None and state is ExecutionState.RUNNING:
                self._end(controller, execution, f"execd unreachable for {window:g}s (threshold {threshold})")
            else:
                self._disconnected[controller.env_id] = now  # a live backend keeps waiting: confirm again later
            return
        self._disconnected.pop(controller.env_id, None)  # CTL-5: a reconnect cancels the pending confirmation
        probe = observed.probe
        if threshold is not None and probe is not None and not probe.ok and probe.consecutive_failures >= threshold:
            self._end(controller, execution, f"health probe failed {probe.consecutive_failures} times: {probe.reason}")
            return
        for request in observed.checkpoint_requests:
            controller.note_checkpoint_request(request.operation_id, execution.execution_id)

    def _end(self, controller: Controller, execution: Execution, reason: str) -> None:
        """Hand an execution to its Controller's exit flow: routes retired, cleanup confirmed, then Failed or a
        restart (RST-1, RST-6)."""
        log.warning("ending execution: %s", reason, extra={"env_id": controller.env_id})
        self._ended[controller.env_id] = execution.execution_id
        self._disconnected.pop(controller.env_id, None)
        controller.submit("exited", execution_id=execution.execution_id, info=ExitInfo(reason=reason))

    async def _ack_checkpoint(self, execution: Execution, operation_id: str) -> None:
        if self.control is None:
            raise UnavailableError("no runtime-control subscription to acknowledge the checkpoint on")
        await self.control.ack_checkpoint(str(execution.native["sandbox_id"]), operation_id)

    async def _check_idle(self, controller: Controller) -> None:
        lifecycle = controller.record.spec.lifecycle
        execution = controller.execution
        if lifecycle.idle_timeout_seconds <= 0 or controller.state is not S.RUNNING or execution is None:
            self.idle.forget(controller.env_id)  # IDLE-1: 0 never reclaims
            return
        sandbox_id = str(execution.native["sandbox_id"])
        if self.idle.idle_for(controller.env_id, sandbox_id) < lifecycle.idle_timeout_seconds:
            return
        pausing = lifecycle.idle_action is IdleAction.PAUSE
        gate = controller.open_pause_gate() if pausing else None
        if not await self._close_admission_if_unchanged(controller.env_id, sandbox_id):
            controller.drop_pause_gate()
            return  # demand arrived at the last moment: the window starts again
        self.idle.forget(controller.env_id)
        if gate is not None:
            # IDLE-6: both gates are closed; demand that meets them from now on is recorded by the gate, and
            # the pause re-checks it before capture.
            log.info("idle for %ss: pausing", lifecycle.idle_timeout_seconds, extra={"env_id": controller.env_id})
            controller.submit("pause", auto=True)
            return
        log.info("idle for %ss: deleting", lifecycle.idle_timeout_seconds, extra={"env_id": controller.env_id})
        controller.submit("delete")

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
        self.relay.streams.open_admission(env_id)
        if self.control is not None:
            with contextlib.suppress(AdxError):
                await self.control.open_admission(str(execution.native["sandbox_id"]))

    async def _pause_decision(self, env_id: str) -> bool:
        controller = self.controllers.get(env_id)
        gate = controller.pause_gate if controller is not None else None
        if gate is None:
            return False
        return await gate.wait(PAUSE_DECISION_WAIT_SECONDS)

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
            raise ConflictError(f"node {self.name} is not admitting new Environments now")
        controller = self._controller(record)
        controller.submit("start")
        return controller.record

    def delete(self, record: EnvironmentRecord) -> EnvironmentRecord:
        if record.node != self.name:
            raise NotFoundError(f"environment {record.id} is not on node {self.name}")
        controller = self.controllers.get(record.id) or self._controller(record)
        if controller.record.revision < record.revision:
            controller.record = record
        controller.submit("delete")
        return controller.record

    async def pause(self, record: EnvironmentRecord, within: float) -> EnvironmentRecord:
        controller = self._owned_controller(record)
        done = controller.submit("pause")
        deadline = time.monotonic() + within
        while not done.done():
            if controller.publication_pending:
                # ENV-6: done here, not yet published to the cluster: never reported as a success.
                raise UnavailableError(
                    f"temporarily unavailable: cluster publication pending (the pause of {record.id} is done on "
                    f"node {self.name} and is committed as soon as the Coordinator can store it)"
                )
            if time.monotonic() > deadline:
                raise UnavailableError(f"pause of {record.id} not finished within {within:g}s; it goes on")
            await asyncio.wait([done], timeout=0.05)
        return done.result()

    def resume(self, record: EnvironmentRecord) -> EnvironmentRecord:
        if record.state is not S.RESUMING:
            raise ConflictError(f"environment {record.id} is {record.state.value}, not resuming")
        controller = self._owned_controller(record)
        controller.submit("resume", record=record)
        return record

    def _owned_controller(self, record: EnvironmentRecord) -> Controller:
        if record.node != self.name:
            raise NotFoundError(f"environment {record.id} is not on node {self.name}")
        controller = self.controllers.get(record.id)
        if controller is None or controller.record.generation < record.generation:
            if controller is not None:
                self.controllers.pop(record.id, None)
                self._spawn_close(controller)
            controller = self._controller(record)
        return controller

    def _spawn_close(self, controller: Controller) -> None:
        task = asyncio.create_task(controller.close(), name=f"close-{controller.env_id}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _relay_target(self, env_id: str) -> RelayTarget:
        controller = self.controllers.get(env_id)
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


class NodeService(node_pb2_grpc.NodeServicer):
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    async def AdmitEnvironment(
        self, request: node_pb2.AdmitEnvironmentRequest, context: Context
    ) -> node_pb2.AdmitEnvironmentResponse:
        await require_peer(context, "coordinator")
        try:
            record = EnvironmentRecord.model_validate_json(request.environment_json)
            admitted = self.agent.admit(record)
        except AdxError as exc:
            await abort_with(context, exc)
        except ValueError as exc:
            await abort_with(context, InvalidInputError("environmentJson", str(exc)))
        return node_pb2.AdmitEnvironmentResponse(environment_json=admitted.model_dump_json(by_alias=True))

    async def DeleteEnvironment(
        self, request: node_pb2.DeleteEnvironmentRequest, context: Context
    ) -> node_pb2.DeleteEnvironmentResponse:
        await require_peer(context, "coordinator", "api")
        try:
            record = EnvironmentRecord.model_validate_json(request.environment_json)
            queued = self.agent.delete(record)
        except AdxError as exc:
            await abort_with(context, exc)
        except ValueError as exc:
            await abort_with(context, InvalidInputError("environmentJson", str(exc)))
        return node_pb2.DeleteEnvironmentResponse(environment_json=queued.model_dump_json(by_alias=True))

    async def PauseEnvironment(
        self, request: node_pb2.PauseEnvironmentRequest, context: Context
    ) -> node_pb2.PauseEnvironmentResponse:
        await require_peer(context, "coordinator", "api")
        try:
            record = _record_arg(request.environment_json)
            paused = await self.agent.pause(record, request.timeout_seconds or 330.0)
        except AdxError as exc:
            await abort_with(context, exc)
        return node_pb2.PauseEnvironmentResponse(environment_json=paused.model_dump_json(by_alias=True))

    async def ResumeEnvironment(
        self, request: node_pb2.ResumeEnvironmentRequest, context: Context
    ) -> node_pb2.ResumeEnvironmentResponse:
        await require_peer(context, "coordinator")
        try:
            queued = self.agent.resume(_record_arg(request.environment_json))
        except AdxError as exc:
            await abort_with(context, exc)
        return node_pb2.ResumeEnvironmentResponse(environment_json=queued.model_dump_json(by_alias=True))

    async def EnvironmentStats(
        self, request: node_pb2.EnvironmentStatsRequest, context: Context
    ) -> node_pb2.EnvironmentStatsResponse:
        await require_peer(context, "api")
        try:
            controller = self.agent.controllers.get(request.environment_id)
            if controller is None or controller.record.tenant != request.tenant:
                raise NotFoundError(f"environment {request.environment_id} is not on node {self.agent.name}")
            stats = await self.agent.metrics.stats_of(controller)
        except AdxError as exc:
            await abort_with(context, exc)
        return node_pb2.EnvironmentStatsResponse(stats_json=stats.model_dump_json(by_alias=True))


def _record_arg(text: str) -> EnvironmentRecord:
    try:
        return EnvironmentRecord.model_validate_json(text)
    except ValueError as exc:
        raise InvalidInputError("environmentJson", str(exc)) from None
