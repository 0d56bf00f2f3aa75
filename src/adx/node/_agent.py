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
from adx._coordinator_channel import coordinator_channel
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
    PublicationPendingError,
    UnavailableError,
)
from adx.model import DORMANT_STATES, EnvironmentRecord, EnvironmentState, IdleAction, Resources
from adx.node._controller import CheckpointPlaces, Controller, ControllerTimings, ReadinessProbe
from adx.node._coordinator_client import CoordinatorSink
from adx.node._executions import ExecutionFiles
from adx.node._idle import IdleDetector
from adx.node._journal import DegradationJournal, PendingResult
from adx.node._metrics import MetricsSampler, NodeCollector, metrics_registry
from adx.node._relay import Relay, RelayServer, RelayTarget, serve_asgi, serve_relay
from adx.node._replay import ReplayEnd, replay
from adx.node._reporter import Reporter
from adx.node._resources import CapacityTracker, read_auto, read_capacity_file
from adx.node._watch import EnvironmentWatch
from adx.proto import coordinator_pb2_grpc, health_pb2_grpc, node_pb2, node_pb2_grpc
from adx.runtime import Execution, ExecutionState, ExitInfo, InventoryItem
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
#: How long a request waits for the local resume of an Environment whose pause is not published (JRN-4).
LOCAL_RESUME_WAIT_SECONDS = 30.0


class NodeAgent:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.name = config.name
        self.paths = component_paths(config.certs_dir, Identity("node", config.name))
        self.driver = SandboxdDriver(config.runtime.socket, python=config.runtime.python)
        self.readiness: ReadinessProbe = ExecdReadiness(self.driver)
        self.control: RuntimeControlSubscription | None = None
        self.executions = ExecutionFiles(config.state_dir / "executions")
        self.journal = DegradationJournal(config.degradation_journal)
        # NOD-13: executions whose cleanup is not confirmed yet (their files are the persisted records).
        self._orphans: dict[str, Execution] = {}
        # NOD-1: executions the runtime holds that this node cannot address (seen at the last recovery).
        self.unaddressable: list[InventoryItem] = []
        self._journaled_at_start: list[PendingResult] = []
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
        self.readiness = SubscriptionReadiness(self.driver, self.control)
        credentials = channel_credentials(self.paths)
        self._channel = coordinator_channel(self.config.coordinator, credentials)
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
        if self.control is not None:
            self._tasks.append(asyncio.create_task(self.watch.follow(self.control), name="runtime-events"))
        self._watching = True
        for env_id in list(self.controllers):
            self.watch.watch(env_id)
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
        catalog = await self._wait_for_catalog()
        self._warn_if_journal_missing(catalog)
        if self._journaled_at_start:
            # JRN-6: replay what the journal holds (matching ownership and spec, newer versions only), then read
            # the catalog again; only then reconcile with the runtime and open lifecycle and admission.
            await self._replay_at_start(catalog)
            catalog = await self._wait_for_catalog(with_references=True)
        known = await self._clean_unreferenced(catalog)
        await self._report_inventory(known)
        for record in catalog:
            if record.id in self._orphan_envs():
                continue  # RST-5/NOD-13: nothing of it starts until the old execution's cleanup is confirmed
            await self._recover_one(record, known.get(record.execution_id or ""))
        await self._sweep_checkpoints()

    async def _recover_one(self, record: EnvironmentRecord, execution: Execution | None) -> None:
        """NOD-20: one Environment's recovery failing restricts that Environment only, never the node's start."""
        try:
            await self._recover(record, execution)
        except AdxError as exc:
            log.error(
                "recovery of %s failed: %s; only it waits for the next routine check",
                record.id,
                exc,
                extra={"node": self.name, "env_id": record.id, "execution_id": record.execution_id},
            )
            controller = self.controllers.get(record.id)
            if controller is not None:
                controller.restricted = True

    async def _clean_unreferenced(self, catalog: list[EnvironmentRecord]) -> dict[str, Execution]:
        """CRD-7/NOD-13: executions no committed record references (a start or restore cut short before its
        commit) are cleaned before any Controller resumes or starts anything; the catalog was read fully.

        The execution's file is its persisted cleanup record: it is forgotten only once the runtime confirmed
        the cleanup, and until then that Environment admits nothing here (retried every report period)."""
        # Recorded before every start or restore (its planned address), so this covers what an interrupted
        # launch left in the runtime too.
        known = {execution.execution_id: execution for execution in self.executions.load_all()}
        referenced = {record.execution_id for record in catalog if record.execution_id}
        for execution_id, execution in known.items():
            if execution_id not in referenced and execution.env_id not in self.controllers:
                self._orphans[execution_id] = execution
        await self._retry_orphans()
        return {k: v for k, v in known.items() if k not in self._orphans and k in referenced}

    async def _retry_orphans(self) -> None:
        for execution_id, execution in list(self._orphans.items()):
            try:
                await self.driver.stop(execution)
            except NotFoundError:
                pass
            except AdxError as exc:
                log.warning(
                    "cleanup of an ownerless execution not confirmed: %s; its Environment admits nothing here until "
                    "it is",
                    exc,
                    extra={"node": self.name, "env_id": execution.env_id, "execution_id": execution_id},
                )
                continue
            self.executions.forget(execution_id)
            del self._orphans[execution_id]
            log.info(
                "ownerless execution cleaned",
                extra={"node": self.name, "env_id": execution.env_id, "execution_id": execution_id},
            )

    def _orphan_envs(self) -> set[str]:
        return {execution.env_id for execution in self._orphans.values()}

    async def _report_inventory(self, known: dict[str, Execution]) -> None:
        """NOD-1/NOD-18: the runtime's own inventory, checked against what this node can address. An execution
        the runtime holds for this node without an execution file (its state was lost) can neither be adopted
        nor cleaned without its secret: it is reported, never deleted on a guess."""
        try:
            inventory = await self.driver.inventory()
        except AdxError as exc:
            log.warning("runtime inventory unavailable: %s", exc, extra={"node": self.name})
            return
        addressable = set(known) | set(self._orphans)
        self.unaddressable = [item for item in inventory if item.execution_id not in addressable]
        for item in self.unaddressable:
            log.error(
                "the runtime holds an execution this node has no record of; it is left as it is",
                extra={"node": self.name, "env_id": item.env_id, "execution_id": item.execution_id},
            )

    async def _wait_for_catalog(self, *, with_references: bool = True) -> list[EnvironmentRecord]:
        """Register and read the full catalog, however long the Coordinator takes (JRN-7: nothing is touched
        meanwhile, and no failure is ever read as an empty catalog)."""
        while True:
            await self.reporter.report_once()
            if self.reporter.state.registered:
                try:
                    return await self.sink.catalog(with_references=with_references)
                except AdxError as exc:
                    log.warning("catalog not available yet: %s", exc, extra={"node": self.name})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), min(self.config.report_interval_seconds, 1.0))
            if self.stop_event.is_set():
                raise UnavailableError("node stopped before the Coordinator's catalog could be read")

    async def _replay_at_start(self, catalog: list[EnvironmentRecord]) -> None:
        by_env: dict[str, list[PendingResult]] = {}
        for entry in self._journaled_at_start:
            by_env.setdefault(entry.env_id, []).append(entry)
        records = {record.id: record for record in catalog}
        for env_id, entries in by_env.items():
            record = records.get(env_id)
            # Committed entries (versions the catalog already has) are dropped; the rest must match ownership
            # and spec, which replay() checks against the authority on any conflict.
            stale = [e for e in entries if record is not None and e.revision <= record.revision]
            if stale:
                await self.journal.remove([e.seq for e in stale])
            entries = [e for e in entries if e not in stale]
            if not entries:
                continue
            if record is None or record.generation != entries[0].generation:
                log.warning(
                    "journaled results of a retired ownership dropped",
                    extra={"node": self.name, "env_id": env_id, "dropped": len(entries)},
                )
                await self.journal.remove([e.seq for e in entries])
                continue
            while entries:
                outcome = await replay(self.journal, self.sink, self.name, entries, self._fetch_record)
                if outcome.end is not ReplayEnd.PAUSED:
                    break
                log.warning("journal replay waits for the Coordinator: %s", outcome.reasons, extra={"env_id": env_id})
                await asyncio.sleep(min(self.config.report_interval_seconds, 1.0))
                entries = await self.journal.pending(env_id)
        self._journaled_at_start = []

    async def _fetch_record(self, env_id: str) -> EnvironmentRecord | None:
        return await self.sink.fetch(env_id)

    def _warn_if_journal_missing(self, catalog: list[EnvironmentRecord]) -> None:
        """JRN-8: the configured journal was deleted while it held results (its marker outlived it): they are
        lost; say which Environments the Coordinator shows half-done on this node."""
        if not self.journal.lost:
            return
        unfinished = [r.id for r in catalog if r.state in (S.PAUSING, S.DELETING, S.RESUMING, S.STARTING)]
        log.warning(
            "the degradation journal %s was deleted while it held unpublished results; they are lost "
            "(Environments the Coordinator shows unfinished here: %s)",
            self.journal.path,
            ", ".join(sorted(unfinished)) or "none",
            extra={"node": self.name},
        )

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
        elif record.state is S.STARTING and execution is None:
            controller.submit("continue_start")
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
            elif state is ExecutionState.RUNNING and record.state is S.STARTING:
                controller.submit("finish_start")  # it started; only its Running commit was cut short
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

    async def _retake(self, old_session: str) -> None:
        """NOD-6/NOD-1 after an explicit session rejection and a new handshake: with admission closed, drain
        what each Controller admitted, read the catalog, clean unreferenced executions and recover Environments
        no Controller holds; only then admission opens again."""
        log.warning(
            "the Coordinator rejected session %s: re-taking ownership under %s",
            old_session,
            self.reporter.state.session,
            extra={"node": self.name},
        )
        try:
            for controller in list(self.controllers.values()):
                await asyncio.wait_for(controller.drained(), self.config.report_interval_seconds * 10)
            catalog = await self.sink.catalog()
            known = await self._clean_unreferenced(catalog)
            for record in catalog:
                if record.id not in self.controllers and record.id not in self._orphan_envs():
                    await self._recover_one(record, known.get(record.execution_id or ""))
        except (AdxError, TimeoutError) as exc:
            log.warning("session re-take not finished, retried next round: %s", exc, extra={"node": self.name})
            return
        self.reporter.retaken()
        log.info("session re-taken: admission open", extra={"node": self.name, "session": self.reporter.state.session})

    async def _routine_check_logged(self) -> None:
        try:
            await self._routine_check()
        except AdxError as exc:
            log.warning("routine check failed: %s", exc, extra={"node": self.name})
        except Exception:
            log.exception("routine check crashed", extra={"node": self.name})

    async def _routine_check(self) -> None:
        """NOD-3: compare ownership, generation, state and revision with the catalog; converge through each
        Environment's own queue; never scan the runtime."""
        # NOD-5: the Controllers that exist before the catalog is read; one admitted meanwhile is not judged by
        # a catalog that predates it.
        known_before = {env_id: controller for env_id, controller in self.controllers.items()}
        try:
            catalog = await self.sink.catalog()
        except AdxError as exc:
            # NOD-6: a failed fetch is never an empty catalog; keep everything and retry next round.
            log.warning("routine check skipped: %s", exc, extra={"node": self.name})
            return
        owned = {record.id for record in catalog}
        await self._retry_orphans()
        restricted = self._orphan_envs()
        for record in catalog:
            controller = self.controllers.get(record.id)
            if record.id in restricted:
                continue  # NOD-13: until the old execution's cleanup is confirmed
            if controller is None:
                if record.state is S.PENDING:
                    # NOD-8/NOD-20: a placed Environment starts when this node admits; until then it waits.
                    if self.reporter.admission_open:
                        self._controller(record).submit("start")
                elif record.state is S.DELETING:
                    self._controller(record).submit("delete")
                elif record.state is S.RESUMING:
                    self._controller(record).submit("resume", record=record)
                continue
            if known_before.get(record.id) is not controller or controller.publication_pending:
                # NOD-5/NOD-9: admitted after the read, or a local result newer than the catalog: that one
                # publishes first (its replay re-checks only this Environment).
                continue
            if record.generation > controller.record.generation:
                # NOD-12: ownership moved on to a newer generation here; the old one is cleaned first.
                execution = self.executions.get(record.execution_id or "")
                self._take_over(controller, record, execution)
                await self._recover_one(record, execution)
                continue
            if record.generation < controller.record.generation or record.revision < controller.record.revision:
                continue  # NOD-5: an old catalog never overwrites a newer local state
            if record.state is S.DELETING and controller.state not in (S.DELETING, S.DELETED):
                # NOD-12: queued behind what this Controller admitted before; it adopts the record in its queue.
                controller.submit("delete", record=record)
            elif (
                record.state is S.RESUMING
                and controller.state in (S.PAUSED, S.RESUMING)
                and record.revision > controller.record.revision
            ):
                controller.submit("resume", record=record)  # a lost resume hand-over (CRD-5)
            elif controller.restricted and record.revision >= controller.record.revision:
                controller.submit("adopt", record=record)  # NOD-10: the authoritative check this one waits for
        now = time.monotonic()
        for env_id, controller in list(self.controllers.items()):
            if controller.publication_pending:
                continue  # its journaled results still have to reach the Coordinator
            gone = env_id not in owned and controller.state is S.PAUSED and controller.execution is None
            if controller.state is S.DELETED or gone or controller.retired:
                # ``gone``: a paused Environment deleted, expired or resumed elsewhere; nothing of it runs here.
                del self.controllers[env_id]
                await controller.close()
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
        controller.submit("exited", execution_id=execution.execution_id, info=ExitInfo(reason=reason))

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
            controller.submit("pause", auto=True)
            return None
        log.info("idle for %ss: deleting", lifecycle.idle_timeout_seconds, extra={"env_id": controller.env_id})
        controller.submit("delete")
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
        self.relay.streams.open_admission(env_id)
        if self.control is not None:
            with contextlib.suppress(AdxError):
                await self.control.open_admission(str(execution.native["sandbox_id"]))

    async def _resume_unpublished(self, env_id: str) -> None:
        """Demand for an Environment paused here whose pause the cluster has not stored yet (the Coordinator was
        away): the cluster still routes it here, so this node resumes it and journals the resume (JRN-3/4)."""
        controller = self.controllers.get(env_id)
        if controller is None or controller.state is not S.PAUSED or not controller.unpublished:
            return
        done = controller.submit("resume_local")
        with contextlib.suppress(AdxError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(done), LOCAL_RESUME_WAIT_SECONDS)

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
            # Temporary (Coordinator unreachable, capacity sample expired, a session re-take in progress): the
            # caller retries or leaves it Pending for this node's routine check; never a failed create.
            raise UnavailableError(f"node {self.name} is not admitting new Environments now; retry shortly")
        if record.id in self._orphan_envs():
            raise UnavailableError(f"environment {record.id}: an earlier execution's cleanup is not confirmed yet")
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
        controller.submit("resume", record=record)
        return record

    def _owned_controller(self, record: EnvironmentRecord) -> Controller:
        if record.node != self.name:
            raise NotFoundError(f"environment {record.id} is not on node {self.name}")
        controller = self.controllers.get(record.id)
        if controller is not None and controller.record.generation < record.generation:
            return self._take_over(controller, record)
        return controller if controller is not None else self._controller(record)

    def _take_over(self, old: Controller, record: EnvironmentRecord, execution: Execution | None = None) -> Controller:
        """NOD-12/NOD-14: a newer generation of an Environment this node holds an older one of: the old
        Controller cleans its execution behind what it admitted, then refuses everything; the new one starts
        from the catalog's record and acts only after that cleanup (RST-5)."""
        log.warning(
            "generation %d replaces %d here",
            record.generation,
            old.record.generation,
            extra={"node": self.name, "env_id": record.id, "generation": record.generation},
        )
        revoked = old.submit("revoke")
        self.controllers.pop(record.id, None)
        revoked.add_done_callback(lambda _: self._spawn_close(old))
        controller = self._controller(record, execution)
        controller.submit("after", prior=revoked)
        return controller

    def _spawn_close(self, controller: Controller) -> None:
        task = asyncio.create_task(controller.close(), name=f"close-{controller.env_id}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

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

    async def DescribeEnvironment(
        self, request: node_pb2.DescribeEnvironmentRequest, context: Context
    ) -> node_pb2.DescribeEnvironmentResponse:
        await require_peer(context, "api")
        try:
            controller = self.agent.controllers.get(request.environment_id)
            if controller is None or controller.record.tenant != request.tenant:
                raise NotFoundError(f"environment {request.environment_id} is not on node {self.agent.name}")
        except AdxError as exc:
            await abort_with(context, exc)
        return node_pb2.DescribeEnvironmentResponse(
            environment_json=controller.record.model_dump_json(by_alias=True),
            publication_pending=controller.publication_pending,
            journaled=controller.unpublished > 0,
        )


def _record_arg(text: str) -> EnvironmentRecord:
    try:
        return EnvironmentRecord.model_validate_json(text)
    except ValueError as exc:
        raise InvalidInputError("environmentJson", str(exc)) from None
