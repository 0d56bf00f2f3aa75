"""The Coordinator's gRPC service: the node-facing calls (register, sessions, catalog, results) and the API's
Environment calls, whose creates run in ``_create`` and whose pause/resume/lifetime/network run in
``_lifecycle``. Every call is checked against the caller's certificate (SEC-1) and, for node calls, against the
node's registered, unexpired session (CRD-4)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import cast

import grpc

from adx._grpc_errors import abort_with
from adx._grpc_serve import serve
from adx._grpc_tls import require_peer
from adx._node_client import NodeClients
from adx.coordinator._admin_store import AdminStore
from adx.coordinator._cache import CoordinatorCache
from adx.coordinator._create import EnvironmentCreator
from adx.coordinator._lifecycle import LifecycleOps
from adx.coordinator._store import CoordinatorStore, RouteMessage
from adx.coordinator._token_store import REVOKED_FIELD
from adx.errors import (
    AdxError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    SessionExpiredError,
    SessionRejectedError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.model import (
    EnvironmentRecord,
    EnvironmentSpec,
    EnvironmentState,
    NetworkPolicy,
    Resources,
    check_transition,
    parse_wire,
)
from adx.model._records import RecordChanges
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("adx.coordinator")

Context = grpc.aio.ServicerContext[object, object]

# Fields of an Environment record a node may change with CommitResult; ownership fields are not among them.
NODE_COMMITTABLE = frozenset(
    {
        "state",
        "executionId",
        "restartAttempts",
        "restartPending",
        "checkpoint",
        "lastError",
        "resumeIntent",
        "networkAppliedRevision",
    }
)


#: WatchRoutes sends a heartbeat after this long without a publication (subscribers give up on a silent stream
#: after a few: adx.gateway._coordinator.ROUTE_STREAM_SILENCE_SECONDS).
ROUTE_HEARTBEAT_SECONDS = 1.0

#: How long a delete's reply waits for the node to release the reservation (it usually takes milliseconds).
DELETE_RELEASE_WAIT_SECONDS = 5.0


class CoordinatorService(pb_grpc.CoordinatorServicer):
    def __init__(
        self,
        store: CoordinatorStore,
        cache: CoordinatorCache,
        *,
        nodes: NodeClients | None = None,
        session_ttl: float = 15.0,
        resume_retry_seconds: float = 30.0,
    ) -> None:
        self.store = store
        self.admin = AdminStore(store)
        self.cache = cache
        self.nodes = nodes
        self.session_ttl = session_ttl
        self.creator = EnvironmentCreator(store, cache, nodes)
        self.lifecycle = LifecycleOps(
            store, cache, nodes, delete=self._delete, resume_retry_seconds=resume_retry_seconds
        )

    async def _node_caller(self, context: Context, node: str) -> None:
        identity = await require_peer(context, "node")
        if identity.name != node:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, f"certificate is for node {identity.name}, not {node}"
            )

    def _check_session(self, node: str, session: str) -> None:
        known = self.cache.nodes.get(node)
        if known is None:
            raise NotFoundError(f"node {node} is not registered")
        if known.session != session:
            raise SessionRejectedError(f"node {node}: session is not the registered one; register again")
        if known.session_expires_at < time.time():
            raise SessionExpiredError(f"node {node}: session expired; register again")

    async def _refresh_node(self, node: str) -> None:
        self.cache.nodes[node] = await self.store.get_node(node)

    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: Context) -> pb.RegisterNodeResponse:
        await self._node_caller(context, request.node)
        try:
            previous = await self.store.register_node(
                request.node,
                session=request.session,
                address=request.address,
                relay_address=request.relay_address,
                session_ttl=self.session_ttl,
                checkpoint_capable=request.checkpoint_capable,
                shared_storage=request.shared_storage,
            )
            await self._refresh_node(request.node)
        except AdxError as exc:
            await abort_with(context, exc)
        log.info("node registered", extra={"node": request.node, "session": request.session, "previous": previous})
        return pb.RegisterNodeResponse(previous_session=previous, session_ttl_seconds=self.session_ttl)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Context) -> pb.HeartbeatResponse:
        await self._node_caller(context, request.node)
        try:
            await self.store.heartbeat(request.node, request.session, self.session_ttl)
            await self._refresh_node(request.node)
        except AdxError as exc:
            await abort_with(context, exc)
        return pb.HeartbeatResponse(session_ttl_seconds=self.session_ttl)

    async def ReportCapacity(self, request: pb.ReportCapacityRequest, context: Context) -> pb.ReportCapacityResponse:
        await self._node_caller(context, request.node)
        try:
            capacity = parse_wire(Resources, _json(request.capacity_json, "capacityJson"), "capacity")
            await self.store.report_capacity(
                request.node,
                request.session,
                capacity,
                valid_for=request.valid_for_seconds,
                admission_open=request.admission_open,
                admission_reason=request.admission_reason,
                devices=list(request.devices),
                cpu_overcommit=request.cpu_overcommit,
            )
            await self._refresh_node(request.node)
        except AdxError as exc:
            await abort_with(context, exc)
        return pb.ReportCapacityResponse()

    async def InspectNode(self, request: pb.InspectNodeRequest, context: Context) -> pb.InspectNodeResponse:
        await self._node_caller(context, request.node)
        try:
            self._check_session(request.node, request.session)
            # CRD-2: after an uncertain write a catalog is served again only after a reload; the global
            # reference list covers every node's records.
            for suspect in self.cache.suspect_nodes() if request.with_references else [request.node]:
                if not self.cache.catalog_valid(suspect):
                    await self.cache.reload_suspects(self.store, suspect)
            # CRD-9: the artifacts snapshots hold are referenced too (no Environment record names them).
            references = (
                [*self.cache.referenced_checkpoints(), *await self.store.snapshot_checkpoints()]
                if request.with_references
                else []
            )
        except AdxError as exc:
            await abort_with(context, exc)
        node = self.cache.nodes[request.node]
        retired = [
            ref.model_dump_json(by_alias=True)
            for ref in self.cache.retired_checkpoints
            if ref.node == request.node or (ref.storage == "shared" and node.shared_storage)
        ]
        return pb.InspectNodeResponse(
            environment_json=self.cache.node_catalog_wire(request.node),
            served_at=time.time(),
            retired_checkpoint_json=retired,
            referenced_checkpoint_ids=references,
            references_included=request.with_references,
            # Issue 13: where this node may pull an image its store lacks (nodes of a live session only).
            peers=[
                pb.PeerNode(name=n.name, address=n.address)
                for n in self.cache.nodes.values()
                if n.name != request.node and n.session_expires_at > time.time() and n.address
            ],
        )

    async def ConfirmCheckpointDeleted(
        self, request: pb.ConfirmCheckpointDeletedRequest, context: Context
    ) -> pb.ConfirmCheckpointDeletedResponse:
        await self._node_caller(context, request.node)
        try:
            self._check_session(request.node, request.session)
            forgotten = await self.store.forget_checkpoint(request.checkpoint_id)
        except AdxError as exc:
            await abort_with(context, exc)
        self.cache.retired_checkpoints = [r for r in self.cache.retired_checkpoints if r.id != request.checkpoint_id]
        log.info("checkpoint deleted", extra={"node": request.node, "checkpoint_id": request.checkpoint_id})
        return pb.ConfirmCheckpointDeletedResponse(forgotten=forgotten)

    async def CommitResult(self, request: pb.CommitResultRequest, context: Context) -> pb.CommitResultResponse:
        await self._node_caller(context, request.node)
        try:
            self._check_session(request.node, request.session)
            committed = await self._commit_for_node(request)
        except AdxError as exc:
            await abort_with(context, exc)
        return pb.CommitResultResponse(environment_json=committed.model_dump_json(by_alias=True))

    async def _commit_for_node(self, request: pb.CommitResultRequest) -> EnvironmentRecord:
        changes = _json(request.changes_json, "changesJson")
        if not isinstance(changes, dict):
            raise InvalidInputError("changesJson", "must be a JSON object")
        forbidden = sorted(set(changes) - NODE_COMMITTABLE)
        if forbidden:
            raise InvalidInputError(f"changesJson.{forbidden[0]}", "may not be changed by a node")
        current = self.cache.environments.get(request.environment_id)
        if current is None or current.node != request.node:
            raise NotFoundError(f"environment {request.environment_id} is not owned by node {request.node}")
        if (current.revision, current.generation) != (request.expected_revision, request.expected_generation):
            raise ConflictError(
                f"environment {current.id}: stale result (expected revision {request.expected_revision} "
                f"generation {request.expected_generation}, committed {current.revision}/{current.generation})",
                details={"revision": current.revision, "generation": current.generation},
            )
        merged = parse_wire(EnvironmentRecord, {**current.to_wire(), **changes})
        if merged.state is not current.state:
            # The node checks its own transitions against its record; a node whose record diverged (a journaled
            # result the authority never stored) must not move the authority along a path the state table
            # forbids, e.g. a Deleting record to Paused.
            check_transition(current.state, merged.state, env_id=current.id)
        # The fields of a validated record, with its types: a RecordChanges (the store sets revision and time).
        update = cast(RecordChanges, {name: getattr(merged, name) for name in merged.model_fields_set if name != "id"})
        if merged.state is EnvironmentState.RUNNING and (current.ownership_lost or current.recovery_pending):
            # CRD-6/CRD-10: it runs on a live node again: the recovery from the lost one is over.
            update["ownership_lost"] = update["recovery_pending"] = False
        try:
            committed = await self.store.commit_environment(
                current, update, release_reservation=request.release_reservation
            )
        except UncertainOutcomeError:
            self.cache.invalidate(current.id, current.node)
            raise
        except ConflictError:
            # Someone else committed: reload the authority before anyone acts on the cache again.
            self.cache.invalidate(current.id, current.node)
            # If Redis is unavailable now, the record stays suspect and the next InspectNode reloads it.
            with contextlib.suppress(UnavailableError):
                await self.cache.reload_suspects(self.store, request.node)
            raise
        self.cache.apply(committed)
        log.info(
            "result committed",
            extra={
                "env_id": committed.id,
                "node": request.node,
                "generation": committed.generation,
                "execution_id": committed.execution_id,
                "state": committed.state.value,
                "revision": committed.revision,
            },
        )
        return committed

    # -- API-facing calls ----------------------------------------------------------------------------
    async def CreateTenant(self, request: pb.CreateTenantRequest, context: Context) -> pb.CreateTenantResponse:
        api_key = await serve(context, lambda: self.store.create_tenant(request.name), "api")
        return pb.CreateTenantResponse(api_key=api_key)

    async def Authenticate(self, request: pb.AuthenticateRequest, context: Context) -> pb.AuthenticateResponse:
        async def work() -> pb.AuthenticateResponse:
            tenant = await self.store.authenticate(request.api_key)
            return pb.AuthenticateResponse(tenant=tenant, disabled=await self.admin.tenant_disabled(tenant))

        return await serve(context, work, "api")

    async def CreateEnvironment(self, request: pb.CreateEnvironmentRequest, context: Context) -> pb.EnvironmentReply:
        async def work() -> tuple[EnvironmentRecord, bool]:
            spec = parse_wire(EnvironmentSpec, _json(request.spec_json, "specJson"))
            return await self.creator.create(request.tenant, spec, request.idempotency_key or None)

        record, created = await serve(context, work, "api")
        return pb.EnvironmentReply(environment_json=record.model_dump_json(by_alias=True), created=created)

    async def GetEnvironment(self, request: pb.EnvironmentRequest, context: Context) -> pb.EnvironmentReply:
        record = await serve(
            context, lambda: self.store.get_tenant_environment(request.tenant, request.environment_id), "api"
        )
        return pb.EnvironmentReply(environment_json=record.model_dump_json(by_alias=True))

    async def ListEnvironments(
        self, request: pb.ListEnvironmentsRequest, context: Context
    ) -> pb.ListEnvironmentsResponse:
        records = await serve(context, lambda: self.store.list_environments(request.tenant), "api")
        return pb.ListEnvironmentsResponse(environment_json=[r.model_dump_json(by_alias=True) for r in records])

    async def DeleteEnvironment(self, request: pb.EnvironmentRequest, context: Context) -> pb.EnvironmentReply:
        record = await serve(context, lambda: self._delete(request.tenant, request.environment_id), "api")
        return pb.EnvironmentReply(environment_json=record.model_dump_json(by_alias=True))

    async def _delete(self, tenant: str, env_id: str) -> EnvironmentRecord:
        for _ in range(5):
            record = await self.store.get_tenant_environment(tenant, env_id)
            if record.state in (EnvironmentState.DELETING, EnvironmentState.DELETED):
                break
            # Nothing of a paused Environment runs anywhere: retire it here (its checkpoint is retired with it,
            # CRD-9), whether or not its node is reachable.
            target = EnvironmentState.DELETED if record.state is EnvironmentState.PAUSED else EnvironmentState.DELETING
            try:
                record = await self.store.commit_environment(record, {"state": target}, check_generation=False)
                break
            except ConflictError:
                continue  # committed meanwhile: read again and retry
        else:
            raise ConflictError(f"environment {env_id} keeps changing; try the delete again")
        self.cache.apply(record)
        if record.state is EnvironmentState.DELETING and record.node and self.nodes is not None:
            node = self.cache.nodes.get(record.node)
            if node is not None:
                try:
                    record = await self.nodes.delete(node.address, record)
                except AdxError as exc:
                    # The node converges from its catalog (NOD-3); the delete intent is committed.
                    log.warning("node did not take the delete of %s yet: %s", env_id, exc, extra={"env_id": env_id})
                    return record
                record = await self._released(record, DELETE_RELEASE_WAIT_SECONDS)
        return record

    async def _released(self, record: EnvironmentRecord, within: float) -> EnvironmentRecord:
        """The record once its node committed it Deleted (cgroup empty, reservation released: SBX-7), so a create
        right after the delete's reply finds the room; still Deleting after ``within`` seconds (the reply says
        so: the release follows)."""
        deadline = time.monotonic() + within
        while record.state is EnvironmentState.DELETING and (remaining := deadline - time.monotonic()) > 0:
            # A short poll as well: an apply that lands between the read and the wait sets no new event.
            await self.cache.wait_change(record.id, min(remaining, 0.05))
            latest = self.cache.environments.get(record.id)
            if latest is None:  # the cache drops a Deleted record: read it back from the authority
                return await self.store.get_environment(record.id)
            record = latest
        return record

    async def ResolveRoute(self, request: pb.EnvironmentRequest, context: Context) -> pb.RouteReply:
        record = await serve(
            context, lambda: self.store.get_tenant_environment(request.tenant, request.environment_id), "api"
        )
        return self._route_reply(record)

    async def PauseEnvironment(self, request: pb.EnvironmentRequest, context: Context) -> pb.EnvironmentReply:
        record = await serve(context, lambda: self.lifecycle.pause(request.tenant, request.environment_id), "api")
        return pb.EnvironmentReply(environment_json=record.model_dump_json(by_alias=True))

    async def EnsureRunning(self, request: pb.EnsureRunningRequest, context: Context) -> pb.RouteReply:
        timeout = request.timeout_seconds if request.timeout_seconds > 0 else 60.0
        record = await serve(
            context,
            lambda: self.lifecycle.ensure_running(request.tenant, request.environment_id, min(timeout, 3600.0)),
            "api",
        )
        return self._route_reply(record)

    async def SetLifetime(self, request: pb.SetLifetimeRequest, context: Context) -> pb.EnvironmentReply:
        async def work() -> EnvironmentRecord:
            if not 1 <= request.seconds <= 30 * 86_400:
                raise InvalidInputError("seconds", "must be between 1 and 2592000 (30 days)")
            if request.action not in ("", "delete", "pause"):
                raise InvalidInputError("action", "must be 'delete' or 'pause'")
            return await self.lifecycle.set_lifetime(
                request.tenant, request.environment_id, request.seconds, request.action
            )

        record = await serve(context, work, "api")
        return pb.EnvironmentReply(environment_json=record.model_dump_json(by_alias=True))

    async def SetNetwork(self, request: pb.SetNetworkRequest, context: Context) -> pb.EnvironmentReply:
        async def work() -> EnvironmentRecord:
            try:
                body = json.loads(request.network_json or "{}")
            except json.JSONDecodeError:
                raise InvalidInputError("network", "not a JSON object") from None
            network = parse_wire(NetworkPolicy, body, root="network")
            return await self.lifecycle.set_network(request.tenant, request.environment_id, network)

        record = await serve(context, work, "api")
        return pb.EnvironmentReply(environment_json=record.model_dump_json(by_alias=True))

    def _route_reply(self, record: EnvironmentRecord) -> pb.RouteReply:
        node = self.cache.nodes.get(record.node or "")
        return pb.RouteReply(
            environment_json=record.model_dump_json(by_alias=True),
            relay_address=node.relay_address if node else "",
            node_address=node.address if node else "",
        )

    async def WatchRoutes(self, request: pb.WatchRoutesRequest, context: Context) -> AsyncIterator[pb.RouteEvent]:
        """Relay the route publications (Redis pub/sub) to an API/Ingress replica, resync first."""
        subscription = await serve(context, lambda: self.store.subscribe_routes(), "api")
        # Published routes and, when nothing was published for a while, heartbeats: a subscriber that hears
        # nothing for several of them knows its replica froze (a SIGSTOPped one keeps its TCP port open and gRPC
        # keepalive did not notice it here) and looks for the active one again.
        events: asyncio.Queue[RouteMessage | AdxError | None] = asyncio.Queue()
        pump = asyncio.create_task(_pump_routes(subscription, events), name="route-publications")
        try:
            # Anything cached before this stream existed may be stale: the subscriber starts clean.
            yield pb.RouteEvent(resync=True)
            while True:
                try:
                    route = await asyncio.wait_for(events.get(), ROUTE_HEARTBEAT_SECONDS)
                except TimeoutError:
                    yield pb.RouteEvent(heartbeat=True)
                    continue
                if isinstance(route, AdxError):
                    await abort_with(context, route)
                if route is None:
                    return
                if REVOKED_FIELD in route:  # SEC-4: Ingresses drop a revoked endpoint token from their caches
                    yield pb.RouteEvent(revoked_token=str(route[REVOKED_FIELD]))
                    continue
                node_name = str(route.get("node") or "")
                node = self.cache.nodes.get(node_name)
                yield pb.RouteEvent(
                    environment_id=str(route["id"]),
                    tenant=str(route["tenant"]),
                    node=node_name,
                    state=str(route["state"]),
                    revision=int(cast(int, route["revision"])),  # a JSON number
                    relay_address=node.relay_address if node else "",
                )
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            await subscription.aclose()


async def _pump_routes(
    subscription: AsyncIterator[RouteMessage], events: asyncio.Queue[RouteMessage | AdxError | None]
) -> None:
    """Route publications into ``events``; then None (the subscription ended) or the error that ended it."""
    try:
        async for route in subscription:
            events.put_nowait(route)
    except AdxError as exc:
        events.put_nowait(exc)
        return
    events.put_nowait(None)


def _json(text: str, field: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInputError(field, f"is not valid JSON: {exc}") from None
