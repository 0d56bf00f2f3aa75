"""The Coordinator's snapshot service (CoordinatorSnapshots), called by API servers for a tenant they
authenticated: capture a snapshot of a running Environment (its node's Snapshot operation), list, delete, and
create Environments from one; plus the expiry sweep (ENV-3's retention, from the source's pause options).

A snapshot belongs to the tenant, not to its source: deleting the source leaves it (and its artifact) in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import grpc

from adx._grpc_serve import serve
from adx.coordinator._service import CoordinatorService
from adx.coordinator._snapshot_store import SnapshotStore
from adx.coordinator._sweeps import sweep_every
from adx.errors import ConflictError, InvalidInputError, NotFoundError, UnavailableError
from adx.model import (
    OPERATION,
    SNAPSHOT,
    EnvironmentSpec,
    EnvironmentState,
    Snapshot,
    new_id,
    parse_wire,
    source_spec,
)
from adx.proto import snapshots_pb2 as pb
from adx.proto import snapshots_pb2_grpc as pb_grpc

log = logging.getLogger("adx.coordinator")
Context = grpc.aio.ServicerContext[object, object]
#: The longest snapshot name (E2B's template names are short; a bound keeps the store's keys small).
MAX_NAME_LENGTH = 128


def _name(value: str) -> str | None:
    """A snapshot name as given (E2B's ``name[:tag]``; the tag is part of the name here)."""
    if not value:
        return None
    if len(value) > MAX_NAME_LENGTH or not value.isprintable() or value.startswith(f"{SNAPSHOT}-"):
        raise InvalidInputError("name", f"must be printable, at most {MAX_NAME_LENGTH} characters, not an ID")
    return value


class CoordinatorSnapshotsService(pb_grpc.CoordinatorSnapshotsServicer):
    def __init__(self, service: CoordinatorService) -> None:
        self.service = service
        self.snapshots = SnapshotStore(service.store)

    async def resolve(self, tenant: str, ref: str) -> Snapshot:
        """An ID, or a name (its newest snapshot); another tenant's is the same NotFoundError as none (SEC-2)."""
        if ref.startswith(f"{SNAPSHOT}-"):
            found = await self.snapshots.get(ref)
            if found is not None and found.tenant == tenant:
                return found
        elif ref:
            named = [s for s in await self.snapshots.of_tenant(tenant) if s.name in (ref, ref.removesuffix(":latest"))]
            if named:
                return named[-1]
        raise NotFoundError(f"snapshot {ref!r} not found")

    async def capture(self, tenant: str, env_id: str, name: str | None) -> Snapshot:
        record = await self.service.store.get_tenant_environment(tenant, env_id)
        if record.state is not EnvironmentState.RUNNING or record.node is None:
            raise ConflictError(f"environment {env_id} is {record.state.value}; only a running one is snapshotted")
        node = self.service.cache.nodes.get(record.node)
        if node is None or self.service.nodes is None:
            raise UnavailableError(f"node {record.node} of {env_id} is not known to this Coordinator now")
        if not node.checkpoint_capable:
            raise ConflictError(f"node {node.name} cannot checkpoint; environment {env_id} cannot be snapshotted")
        budget = float(record.spec.lifecycle.effective_pause_options.timeout_seconds)
        checkpoint = await self.service.nodes.capture_snapshot(
            node.address, record, new_id(OPERATION), wait_seconds=budget
        )
        snapshot = Snapshot(
            id=new_id(SNAPSHOT),
            tenant=tenant,
            name=name,
            source_environment_id=env_id,
            image=record.spec.image,
            checkpoint=checkpoint,
            created_at=checkpoint.published_at,
            expires_at=checkpoint.expires_at,
        )
        # A lost write leaves an unreferenced artifact on the node: its startup sweep deletes it (CRD-9).
        await self.snapshots.put(snapshot)
        log.info(
            "snapshot taken",
            extra={"env_id": env_id, "snapshot_id": snapshot.id, "checkpoint_id": checkpoint.id, "tenant": tenant},
        )
        return snapshot

    async def delete(self, snapshot: Snapshot, *, tenant: str | None) -> None:
        await self.snapshots.drop(snapshot, tenant=tenant)
        # The nodes hear of the retired artifact at their next catalog fetch, without waiting for a scan.
        self.service.cache.retired_checkpoints = [*self.service.cache.retired_checkpoints, snapshot.checkpoint]
        log.info("snapshot deleted", extra={"snapshot_id": snapshot.id, "checkpoint_id": snapshot.checkpoint.id})

    async def CreateSnapshot(self, request: pb.CreateSnapshotRequest, context: Context) -> pb.SnapshotReply:
        async def work() -> str:
            snapshot = await self.capture(request.tenant, request.environment_id, _name(request.name))
            return snapshot.model_dump_json(by_alias=True)

        return pb.SnapshotReply(snapshot_json=await serve(context, work, "api"))

    async def GetSnapshot(self, request: pb.SnapshotRequest, context: Context) -> pb.SnapshotReply:
        async def work() -> str:
            return (await self.resolve(request.tenant, request.snapshot_id)).model_dump_json(by_alias=True)

        return pb.SnapshotReply(snapshot_json=await serve(context, work, "api"))

    async def ListSnapshots(self, request: pb.ListSnapshotsRequest, context: Context) -> pb.ListSnapshotsReply:
        async def work() -> list[str]:
            found = await self.snapshots.of_tenant(request.tenant)
            wanted = request.environment_id
            return [s.model_dump_json(by_alias=True) for s in found if not wanted or s.source_environment_id == wanted]

        return pb.ListSnapshotsReply(snapshot_json=await serve(context, work, "api"))

    async def DeleteSnapshot(self, request: pb.SnapshotRequest, context: Context) -> pb.SnapshotReply:
        async def work() -> str:
            snapshot = await self.resolve(request.tenant, request.snapshot_id)
            await self.delete(snapshot, tenant=request.tenant)
            return snapshot.model_dump_json(by_alias=True)

        return pb.SnapshotReply(snapshot_json=await serve(context, work, "api"))

    async def CreateFromSnapshot(
        self, request: pb.CreateFromSnapshotRequest, context: Context
    ) -> pb.CreatedFromSnapshotReply:
        async def work() -> tuple[str, bool]:
            snapshot = await self.resolve(request.tenant, request.snapshot_id)
            try:
                body = json.loads(request.spec_json or "{}")
            except ValueError as exc:
                raise InvalidInputError("specJson", f"is not valid JSON: {exc}") from None
            spec = source_spec(snapshot, parse_wire(EnvironmentSpec, body))
            record, created = await self.service.creator.create(
                request.tenant, spec, request.idempotency_key or None, snapshot.checkpoint
            )
            return record.model_dump_json(by_alias=True), created

        text, created = await serve(context, work, "api")
        return pb.CreatedFromSnapshotReply(environment_json=text, created=created)

    async def sweep(self, now: float | None = None) -> int:
        """Delete the snapshots whose retention ran out (ENV-3: TTL from the artifact's publication)."""
        reclaimed = 0
        for snapshot_id in await self.snapshots.expired(time.time() if now is None else now):
            snapshot = await self.snapshots.get(snapshot_id)
            if snapshot is None:
                continue
            with contextlib.suppress(NotFoundError):  # deleted meanwhile
                await self.delete(snapshot, tenant=None)
                reclaimed += 1
        return reclaimed

    async def run_sweeps(self, interval: float, stop: asyncio.Event) -> None:
        """Reclaim expired snapshots every ``interval`` seconds until ``stop``."""
        await sweep_every(
            interval, stop, self.sweep, what="snapshot expiry sweep", reclaimed="expired snapshots reclaimed"
        )
