"""The Coordinator's gRPC service (node-facing calls). Every call is checked against the caller's
certificate (SEC-1) and, for node calls, against the node's registered, unexpired session (CRD-4)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

import grpc

from adx._grpc_errors import abort_with
from adx._grpc_tls import require_peer
from adx._node_client import NodeClients
from adx.coordinator._cache import CoordinatorCache
from adx.coordinator._lifecycle import LifecycleOps
from adx.coordinator._placement import Refusal, rank_nodes
from adx.coordinator._store import CoordinatorStore, NoCapacity
from adx.errors import (
    AdxError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.model import (
    ENVIRONMENT,
    CheckpointStorage,
    EnvironmentRecord,
    EnvironmentSpec,
    EnvironmentState,
    Resources,
    new_id,
    parse_wire,
)
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("adx.coordinator")

Context = grpc.aio.ServicerContext[object, object]

# Fields of an Environment record a node may change with CommitResult; ownership fields are not among them.
NODE_COMMITTABLE = frozenset(
    {"state", "executionId", "restartAttempts", "restartPending", "checkpoint", "lastError", "resumeIntent"}
)


class SessionExpired(ConflictError):
    code = "session_expired"


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
        self.cache = cache
        self.nodes = nodes
        self.session_ttl = session_ttl
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
            raise ConflictError(f"node {node}: session is not the registered one; register again")
        if known.session_expires_at < time.time():
            raise SessionExpired(f"node {node}: session expired; register again")

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
        except AdxError as exc:
            await abort_with(context, exc)
        catalog = self.cache.node_catalog(request.node)
        node = self.cache.nodes[request.node]
        retired = [
            ref.model_dump_json(by_alias=True)
            for ref in self.cache.retired_checkpoints
            if ref.node == request.node or (ref.storage == "shared" and node.shared_storage)
        ]
        return pb.InspectNodeResponse(
            environment_json=[record.model_dump_json(by_alias=True) for record in catalog],
            served_at=time.time(),
            retired_checkpoint_json=retired,
            referenced_checkpoint_ids=self.cache.referenced_checkpoints() if request.with_references else [],
            references_included=request.with_references,
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
        update = {name: getattr(merged, name) for name in merged.model_fields_set if name != "id"}
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
        await require_peer(context, "api")
        try:
            api_key = await self.store.create_tenant(request.name)
        except AdxError as exc:
            await abort_with(context, exc)
        return pb.CreateTenantResponse(api_key=api_key)

    async def Authenticate(self, request: pb.AuthenticateRequest, context: Context) -> pb.AuthenticateResponse:
        await require_peer(context, "api")
        try:
            tenant = await self.store.authenticate(request.api_key)
        except AdxError as exc:
            await abort_with(context, exc)
        return pb.AuthenticateResponse(tenant=tenant)

    async def CreateEnvironment(self, request: pb.CreateEnvironmentRequest, context: Context) -> pb.EnvironmentReply:
        await require_peer(context, "api")
        try:
            spec = parse_wire(EnvironmentSpec, _json(request.spec_json, "specJson"))
            record, created = await self._create(request.tenant, spec, request.idempotency_key or None)
        except AdxError as exc:
            await abort_with(context, exc)
        return pb.EnvironmentReply(environment_json=record.model_dump_json(by_alias=True), created=created)

    async def _create(
        self, tenant: str, spec: EnvironmentSpec, idempotency: str | None
    ) -> tuple[EnvironmentRecord, bool]:
        now = time.time()
        lifecycle = spec.lifecycle
        ranked, refused = rank_nodes(
            list(self.cache.nodes.values()),
            spec.resources,
            now,
            needs_checkpoint=lifecycle.may_pause,
            needs_shared_storage=lifecycle.pause_options is not None
            and lifecycle.pause_options.storage is CheckpointStorage.SHARED,
        )
        for node in ranked:
            record = EnvironmentRecord(
                id=new_id(ENVIRONMENT),
                tenant=tenant,
                spec=spec,
                state=EnvironmentState.PENDING,
                node=node.name,
                generation=1,
                revision=1,
                created_at=now,
                updated_at=now,
                expires_at=now + lifecycle.lifetime_seconds if lifecycle.lifetime_seconds else None,
            )
            try:
                outcome = await self.store.create_environment(record, idempotency=idempotency)
            except NoCapacity as exc:
                refused.append(Refusal(node.name, exc.message))
                continue
            self.cache.apply(outcome.record)
            if outcome.created:
                log.info("environment placed", extra={"env_id": record.id, "node": node.name, "tenant": tenant})
                return await self._admit(outcome.record, node.address), True
            return outcome.record, False
        reasons = "; ".join(f"{r.node}: {r.reason}" for r in refused) or "no nodes are registered"
        raise NoCapacity(f"no node can take this Environment now ({reasons})", details={"refusals": reasons})

    async def _admit(self, record: EnvironmentRecord, address: str) -> EnvironmentRecord:
        """Hand a placed Environment to its node. If the node cannot be reached it stays Pending there: the
        node finds it in its catalog on its next routine check (NOD-3). An explicit refusal fails it."""
        if self.nodes is None:
            return record
        try:
            return await self.nodes.admit(address, record)
        except (UnavailableError, UncertainOutcomeError) as exc:
            log.warning("node did not take %s yet: %s", record.id, exc, extra={"env_id": record.id})
            return record
        except AdxError as exc:
            latest = self.cache.environments.get(record.id, record)
            if latest.state is not EnvironmentState.PENDING:
                return latest
            failed = await self.store.commit_environment(
                latest,
                {"state": EnvironmentState.FAILED, "last_error": f"node refused: {exc}"},
                release_reservation=True,
            )
            self.cache.apply(failed)
            return failed

    async def GetEnvironment(self, request: pb.EnvironmentRequest, context: Context) -> pb.EnvironmentReply:
        await require_peer(context, "api")
        try:
            record = await self.store.get_tenant_environment(request.tenant, request.environment_id)
        except AdxError as exc:
            await abort_with(context, exc)
        return pb.EnvironmentReply(environment_json=record.model_dump_json(by_alias=True))

    async def ListEnvironments(
        self, request: pb.ListEnvironmentsRequest, context: Context
    ) -> pb.ListEnvironmentsResponse:
        await require_peer(context, "api")
        try:
            records = await self.store.list_environments(request.tenant)
        except AdxError as exc:
            await abort_with(context, exc)
        return pb.ListEnvironmentsResponse(environment_json=[r.model_dump_json(by_alias=True) for r in records])

    async def DeleteEnvironment(self, request: pb.EnvironmentRequest, context: Context) -> pb.EnvironmentReply:
        await require_peer(context, "api")
        try:
            record = await self._delete(request.tenant, request.environment_id)
        except AdxError as exc:
            await abort_with(context, exc)
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

    async def ResolveRoute(self, request: pb.EnvironmentRequest, context: Context) -> pb.RouteReply:
        await require_peer(context, "api")
        try:
            record = await self.store.get_tenant_environment(request.tenant, request.environment_id)
        except AdxError as exc:
            await abort_with(context, exc)
        return self._route_reply(record)

    async def PauseEnvironment(self, request: pb.EnvironmentRequest, context: Context) -> pb.EnvironmentReply:
        await require_peer(context, "api")
        try:
            record = await self.lifecycle.pause(request.tenant, request.environment_id)
        except AdxError as exc:
            await abort_with(context, exc)
        return pb.EnvironmentReply(environment_json=record.model_dump_json(by_alias=True))

    async def EnsureRunning(self, request: pb.EnsureRunningRequest, context: Context) -> pb.RouteReply:
        await require_peer(context, "api")
        timeout = request.timeout_seconds if request.timeout_seconds > 0 else 60.0
        try:
            record = await self.lifecycle.ensure_running(request.tenant, request.environment_id, min(timeout, 3600.0))
        except AdxError as exc:
            await abort_with(context, exc)
        return self._route_reply(record)

    async def SetLifetime(self, request: pb.SetLifetimeRequest, context: Context) -> pb.EnvironmentReply:
        await require_peer(context, "api")
        try:
            if not 1 <= request.seconds <= 30 * 86_400:
                raise InvalidInputError("seconds", "must be between 1 and 2592000 (30 days)")
            if request.action not in ("", "delete", "pause"):
                raise InvalidInputError("action", "must be 'delete' or 'pause'")
            record = await self.lifecycle.set_lifetime(
                request.tenant, request.environment_id, request.seconds, request.action
            )
        except AdxError as exc:
            await abort_with(context, exc)
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
        await require_peer(context, "api")
        try:
            subscription = await self.store.subscribe_routes()
        except AdxError as exc:
            await abort_with(context, exc)
        try:
            # Anything cached before this stream existed may be stale: the subscriber starts clean.
            yield pb.RouteEvent(resync=True)
            async for route in subscription:
                node = self.cache.nodes.get(route.get("node") or "")
                yield pb.RouteEvent(
                    environment_id=str(route["id"]),
                    tenant=str(route["tenant"]),
                    node=str(route.get("node") or ""),
                    state=str(route["state"]),
                    revision=int(route["revision"]),
                    relay_address=node.relay_address if node else "",
                )
        finally:
            await subscription.aclose()


def _json(text: str, field: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInputError(field, f"is not valid JSON: {exc}") from None
