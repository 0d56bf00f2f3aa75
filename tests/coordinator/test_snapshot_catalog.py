"""Snapshots in the Coordinator's checkpoint catalog, on a real Redis server: the artifact a snapshot holds is
never retired by an Environment's reference moving (the first start of an Environment made from it drops its
reference), is part of CRD-9's global reference list while the snapshot lives, and is retired (for its node to
delete) when the snapshot is deleted or its retention runs out (ENV-3)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import pytest

from adx.coordinator import CoordinatorStore
from adx.coordinator._cache import CoordinatorCache
from adx.coordinator._service import CoordinatorService
from adx.coordinator._snapshot_service import CoordinatorSnapshotsService
from adx.embedded import EmbeddedRedis
from adx.errors import NotFoundError
from adx.model import (
    SNAPSHOT,
    CheckpointRef,
    EnvironmentRecord,
    EnvironmentSpec,
    EnvironmentState,
    Resources,
    Snapshot,
    new_id,
)


@pytest.fixture
async def store(redis_factory: Callable[..., EmbeddedRedis]) -> AsyncIterator[CoordinatorStore]:
    info = redis_factory().read_info()
    assert info is not None
    store = CoordinatorStore.from_url(info.url, timeout=2)
    yield store
    await store.close()


async def snapshots_of(store: CoordinatorStore) -> CoordinatorSnapshotsService:
    return CoordinatorSnapshotsService(CoordinatorService(store, await CoordinatorCache.load(store)))


def snapshot(tenant: str = "acme", *, expires_at: float | None = None, name: str | None = None) -> Snapshot:
    now = time.time()
    checkpoint = CheckpointRef(
        id=new_id("ckp"),
        storage="local",
        node="n1",
        location=f"/var/lib/adx/checkpoints/{new_id('ckp')}",
        digest="0" * 64,
        published_at=now,
        expires_at=expires_at,
    )
    return Snapshot(
        id=new_id(SNAPSHOT),
        tenant=tenant,
        name=name,
        source_environment_id=new_id("env"),
        image="base",
        checkpoint=checkpoint,
        created_at=now,
        expires_at=expires_at,
    )


async def retired_ids(store: CoordinatorStore) -> set[str]:
    return {ref.id for ref in await store.retired_checkpoints()}


@pytest.mark.req("CRD-9")
async def test_a_snapshot_artifact_stays_referenced_until_the_snapshot_is_deleted(store: CoordinatorStore) -> None:
    service = await snapshots_of(store)
    kept = snapshot(name="nightly")
    await service.snapshots.put(kept)
    assert kept.checkpoint.id in await store.snapshot_checkpoints()

    # An Environment made from it names the checkpoint until its first start; Running drops the reference, and
    # the catalog must not retire the snapshot's artifact for it (it would for an Environment's own checkpoint).
    session = new_id("ses")
    await store.register_node("n1", session=session, address="n1:1", session_ttl=60)
    await store.report_capacity(
        "n1", session, Resources(cpu_millis=4000, memory_bytes=2**33, disk_bytes=0), valid_for=30
    )
    now = time.time()
    made = EnvironmentRecord(
        id=new_id("env"),
        tenant="acme",
        spec=EnvironmentSpec(resources=Resources(cpu_millis=500, memory_bytes=2**29)),
        state=EnvironmentState.PENDING,
        node="n1",
        generation=1,
        revision=1,
        created_at=now,
        updated_at=now,
        checkpoint=kept.checkpoint,
    )
    await store.create_environment(made)
    starting = await store.commit_environment(made, {"state": EnvironmentState.STARTING, "execution_id": "exe-1"})
    await store.commit_environment(starting, {"state": EnvironmentState.RUNNING, "checkpoint": None})
    assert kept.checkpoint.id not in await retired_ids(store)
    assert kept.checkpoint.id in await store.snapshot_checkpoints()

    # Found by ID and by name, only for its tenant.
    assert (await service.resolve("acme", kept.id)).id == kept.id
    assert (await service.resolve("acme", "nightly")).id == kept.id
    with pytest.raises(NotFoundError):
        await service.resolve("other", kept.id)
    with pytest.raises(NotFoundError):
        await service.snapshots.drop(kept, tenant="other")

    await service.delete(kept, tenant="acme")
    assert kept.checkpoint.id in await retired_ids(store)  # the node deletes it, then it is forgotten
    assert kept.checkpoint.id not in await store.snapshot_checkpoints()
    assert await service.snapshots.get(kept.id) is None
    with pytest.raises(NotFoundError):
        await service.snapshots.drop(kept, tenant="acme")
    assert await store.forget_checkpoint(kept.checkpoint.id)
    assert kept.checkpoint.id not in await retired_ids(store)


@pytest.mark.req("ENV-3")
async def test_expired_snapshots_are_reclaimed_by_the_sweep(store: CoordinatorStore) -> None:
    """ENV-3: a TTL counts from the artifact's publication; ``forever`` (no expiry) lives until deleted."""
    service = await snapshots_of(store)
    now = time.time()
    expired = snapshot(expires_at=now - 1)
    later = snapshot(expires_at=now + 3600)
    forever = snapshot()
    for item in (expired, later, forever):
        await service.snapshots.put(item)

    assert await service.sweep(now) == 1
    assert [s.id for s in await service.snapshots.of_tenant("acme")] == [later.id, forever.id]
    assert expired.checkpoint.id in await retired_ids(store)
    assert {later.checkpoint.id, forever.checkpoint.id} <= set(await store.snapshot_checkpoints())
    assert expired.checkpoint.id not in await store.snapshot_checkpoints()

    assert await service.sweep(now + 7200) == 1  # the TTL one; the forever one stays
    assert [s.id for s in await service.snapshots.of_tenant("acme")] == [forever.id]
    assert await service.sweep(now + 10**9) == 0
