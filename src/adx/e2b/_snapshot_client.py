"""The API server's calls to the Coordinator's snapshot service, with the client's error translation."""

from __future__ import annotations

import json

from adx.gateway import Plane
from adx.model import EnvironmentRecord, EnvironmentSpec, Snapshot, parse_wire
from adx.proto import snapshots_pb2 as pb

#: How long a snapshot capture may take end to end (the node's budget is the source's pause timeout, 300 s by
#: default): the Coordinator answers sooner with its own error.
CAPTURE_WAIT_SECONDS = 3700.0


def _snapshot(text: str) -> Snapshot:
    return parse_wire(Snapshot, json.loads(text), "snapshot")


async def create_snapshot(p: Plane, tenant: str, env_id: str, name: str | None) -> Snapshot:
    request = pb.CreateSnapshotRequest(tenant=tenant, environment_id=env_id, name=name or "")
    stub = p.coordinator.snapshots
    reply = await p.coordinator.call(
        "create snapshot", lambda: stub.CreateSnapshot(request, timeout=CAPTURE_WAIT_SECONDS), reads=False
    )
    return _snapshot(reply.snapshot_json)


async def list_snapshots(p: Plane, tenant: str, env_id: str | None) -> list[Snapshot]:
    request = pb.ListSnapshotsRequest(tenant=tenant, environment_id=env_id or "")
    stub = p.coordinator.snapshots
    timeout = p.config.coordinator_timeout_seconds
    reply = await p.coordinator.call("list snapshots", lambda: stub.ListSnapshots(request, timeout=timeout), reads=True)
    return [_snapshot(text) for text in reply.snapshot_json]


async def get_snapshot(p: Plane, tenant: str, ref: str) -> Snapshot:
    request = pb.SnapshotRequest(tenant=tenant, snapshot_id=ref)
    stub = p.coordinator.snapshots
    timeout = p.config.coordinator_timeout_seconds
    reply = await p.coordinator.call("get snapshot", lambda: stub.GetSnapshot(request, timeout=timeout), reads=True)
    return _snapshot(reply.snapshot_json)


async def delete_snapshot(p: Plane, tenant: str, ref: str) -> Snapshot:
    request = pb.SnapshotRequest(tenant=tenant, snapshot_id=ref)
    stub = p.coordinator.snapshots
    timeout = p.config.coordinator_timeout_seconds
    reply = await p.coordinator.call(
        "delete snapshot", lambda: stub.DeleteSnapshot(request, timeout=timeout), reads=False
    )
    return _snapshot(reply.snapshot_json)


async def create_from_snapshot(
    p: Plane, tenant: str, ref: str, spec: EnvironmentSpec, idempotency_key: str | None
) -> EnvironmentRecord:
    """A new Environment whose first start restores the snapshot (its image is the snapshot's, whatever ``spec``
    names), placed where the snapshot's artifact can be read."""
    request = pb.CreateFromSnapshotRequest(
        tenant=tenant,
        snapshot_id=ref,
        spec_json=spec.model_dump_json(by_alias=True),
        idempotency_key=idempotency_key or "",
    )
    stub = p.coordinator.snapshots
    timeout = p.config.create_timeout_seconds
    reply = await p.coordinator.call(
        "create from snapshot", lambda: stub.CreateFromSnapshot(request, timeout=timeout), reads=False
    )
    return parse_wire(EnvironmentRecord, json.loads(reply.environment_json), "environment")
