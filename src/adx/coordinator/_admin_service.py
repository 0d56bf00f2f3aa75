"""The Coordinator's admin gRPC service (``CoordinatorAdmin``): called by API servers (``api:<name>``
certificates) on behalf of a caller they authenticated with an admin key. Tenants and keys, node listing and
cordons, the cluster's status, and draining a node through the lifecycle (every running Environment paused, so
it resumes on another node on its next use)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
from pydantic import BaseModel

from adx._grpc_serve import serve
from adx.coordinator._service import CoordinatorService
from adx.errors import AdxError
from adx.model import (
    ClusterStatus,
    DrainEvent,
    DrainStep,
    EnvironmentRecord,
    EnvironmentState,
    NodeHealth,
    NodeInfo,
    NodeRecord,
    allocatable,
)
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("adx.coordinator")

Context = grpc.aio.ServicerContext[object, object]
S = EnvironmentState

#: How long a drain waits for an Environment in a passing state (starting, resuming, pausing) to settle.
DRAIN_SETTLE_SECONDS = 60.0
_SETTLING = frozenset({S.PENDING, S.STARTING, S.RESUMING, S.PAUSING})
_GONE = frozenset({S.DELETING, S.DELETED})


def node_info(node: NodeRecord, environments: list[EnvironmentRecord], now: float, session_ttl: float) -> NodeInfo:
    if node.session_expires_at < now:
        health = NodeHealth.LOST
    elif node.capacity_valid_until < now:
        health = NodeHealth.STALE
    else:
        health = NodeHealth.READY
    states = Counter(r.state.value for r in environments if r.node == node.name and r.state is not S.DELETED)
    return NodeInfo(
        name=node.name,
        address=node.address,
        capacity=node.capacity,
        reserved=node.reserved,
        allocatable=allocatable(node.capacity, node.reserved),
        admission_open=node.admission_open,
        admission_reason=node.admission_reason,
        cordoned=node.cordoned,
        health=health,
        # A heartbeat sets the session's expiry to now + TTL.
        last_heartbeat_at=max(node.session_expires_at - session_ttl, 0.0) if node.session_expires_at else 0.0,
        environments=dict(sorted(states.items())),
        checkpoint_capable=node.checkpoint_capable,
        shared_storage=node.shared_storage,
    )


class CoordinatorAdminService(pb_grpc.CoordinatorAdminServicer):
    def __init__(self, service: CoordinatorService, *, leader: str) -> None:
        self.service = service
        self.admin = service.admin
        self.leader = leader

    @staticmethod
    def _reply(model: BaseModel) -> pb.AdminReply:
        return pb.AdminReply(json=model.model_dump_json(by_alias=True))

    async def _one(self, context: Context, work: Callable[[], Awaitable[BaseModel]], done: str = "") -> pb.AdminReply:
        result = await serve(context, work, "api")
        if done:
            subject = getattr(result, "owner", None) or getattr(result, "name", "")
            log.info(done, extra={"subject": subject, "key_id": getattr(result, "key_id", "")})
        return self._reply(result)

    async def _many(self, context: Context, work: Callable[[], Awaitable[Sequence[BaseModel]]]) -> pb.AdminListReply:
        items = await serve(context, work, "api")
        return pb.AdminListReply(json=[item.model_dump_json(by_alias=True) for item in items])

    async def CreateAdminKey(self, request: pb.CreateAdminKeyRequest, context: Context) -> pb.AdminReply:
        return await self._one(
            context, lambda: self.admin.create_admin_key(request.name or "admin"), "admin key created"
        )

    async def AuthenticateAdmin(self, request: pb.AuthenticateAdminRequest, context: Context) -> pb.AdminReply:
        return await self._one(context, lambda: self.admin.authenticate_admin(request.api_key))

    async def CreateTenant(self, request: pb.TenantRequest, context: Context) -> pb.AdminReply:
        return await self._one(context, lambda: self.admin.create_tenant(request.name), "tenant created")

    async def ListTenants(self, request: pb.AdminEmpty, context: Context) -> pb.AdminListReply:
        return await self._many(context, self.admin.list_tenants)

    async def SetTenantDisabled(self, request: pb.SetTenantDisabledRequest, context: Context) -> pb.AdminReply:
        done = "tenant disabled" if request.disabled else "tenant enabled"
        return await self._one(context, lambda: self.admin.set_disabled(request.name, request.disabled), done)

    async def CreateKey(self, request: pb.TenantRequest, context: Context) -> pb.AdminReply:
        return await self._one(context, lambda: self.admin.create_key(request.name), "key created")

    async def RevokeKey(self, request: pb.KeyRequest, context: Context) -> pb.AdminReply:
        log.info("revoking key", extra={"tenant": request.tenant, "key_id": request.key_id})
        return await self._one(context, lambda: self.admin.revoke_key(request.tenant, request.key_id), "key revoked")

    async def RotateKey(self, request: pb.KeyRequest, context: Context) -> pb.AdminReply:
        log.info("rotating key", extra={"tenant": request.tenant, "key_id": request.key_id})
        return await self._one(context, lambda: self.admin.rotate_key(request.tenant, request.key_id), "key rotated")

    # -- nodes and the cluster ----------------------------------------------------------------------
    async def _nodes(self) -> list[NodeInfo]:
        nodes = await self.service.store.list_nodes()
        now = time.time()
        environments = list(self.service.cache.environments.values())
        return [node_info(n, environments, now, self.service.session_ttl) for n in nodes]

    async def ListNodes(self, request: pb.AdminEmpty, context: Context) -> pb.AdminListReply:
        return await self._many(context, self._nodes)

    async def _set_cordoned(self, node: str, cordoned: bool) -> NodeInfo:
        await self.admin.set_cordoned(node, cordoned)
        record = await self.service.store.get_node(node)
        self.service.cache.nodes[node] = record  # placement reads the cache: closed from this moment
        log.info("node cordoned" if cordoned else "node uncordoned", extra={"node": node})
        return node_info(record, list(self.service.cache.environments.values()), time.time(), self.service.session_ttl)

    async def SetNodeCordoned(self, request: pb.SetNodeCordonedRequest, context: Context) -> pb.AdminReply:
        return await self._one(context, lambda: self._set_cordoned(request.node, request.cordoned))

    async def _status(self) -> ClusterStatus:
        nodes = await self._nodes()
        states = Counter(r.state.value for r in self.service.cache.environments.values() if r.state is not S.DELETED)
        return ClusterStatus(
            nodes=nodes, environments=dict(sorted(states.items())), leader=self.leader, served_at=time.time()
        )

    async def ClusterStatus(self, request: pb.AdminEmpty, context: Context) -> pb.AdminReply:
        return await self._one(context, self._status)

    async def DrainNode(self, request: pb.NodeRequest, context: Context) -> AsyncIterator[pb.AdminReply]:
        node = request.node
        await serve(context, lambda: self._set_cordoned(node, True), "api")
        yield self._reply(DrainEvent(node=node, step=DrainStep.CORDONED, message="admits no new Environment"))
        counts: Counter[str] = Counter()
        owned = sorted(
            (r for r in self.service.cache.environments.values() if r.node == node and r.state not in _GONE),
            key=lambda r: r.created_at,
        )
        for record in owned:
            async for event in self._drain_one(node, record):
                counts[event.step.value] += 1
                yield self._reply(event)
        summary = ", ".join(f"{n} {step}" for step, n in sorted(counts.items())) or "no Environments"
        log.info("node drained", extra={"node": node, "summary": summary})
        yield self._reply(DrainEvent(node=node, step=DrainStep.DONE, message=summary))

    async def _drain_one(self, node: str, record: EnvironmentRecord) -> AsyncIterator[DrainEvent]:
        cache = self.service.cache

        def event(step: DrainStep, current: EnvironmentRecord, message: str = "") -> DrainEvent:
            return DrainEvent(
                node=node,
                step=step,
                environment_id=current.id,
                tenant=current.tenant,
                state=current.state.value,
                message=message,
            )

        deadline = time.monotonic() + DRAIN_SETTLE_SECONDS
        current = record
        try:
            # Wait out passing states: a starting one is paused once it runs, a pausing one ends paused.
            while current.state in _SETTLING and time.monotonic() < deadline:
                await cache.wait_change(current.id, 1.0)
                current = await self.service.store.get_environment(current.id)
                cache.apply(current)
            if current.node != node or current.state in _GONE:
                yield event(DrainStep.KEPT, current, f"no longer on {node}")
                return
            if current.state is S.PAUSED:
                yield event(DrainStep.KEPT, current, "already paused" + _where_it_resumes(current))
                return
            if current.state is not S.RUNNING:
                yield event(DrainStep.KEPT, current, f"{current.state.value}: nothing to pause")
                return
            yield event(DrainStep.PAUSING, current)
            paused = await self.service.lifecycle.pause(current.tenant, current.id)
        except AdxError as exc:
            yield event(DrainStep.FAILED, current, str(exc))
            return
        yield event(DrainStep.PAUSED, paused, "checkpointed" + _where_it_resumes(paused))


def _where_it_resumes(record: EnvironmentRecord) -> str:
    checkpoint = record.checkpoint
    if checkpoint is not None and checkpoint.storage == "local":
        return (
            f"; its checkpoint is local to node {checkpoint.node}: it resumes only there (uncordon it), "
            "use pauseOptions.storage 'shared' to let it move"
        )
    return "; resumes on another node on its next use"
