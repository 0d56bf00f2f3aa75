"""The Coordinator's Redis store on a real Redis server: CAS commits, atomic placement, durability."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Callable

import pytest

from adx.coordinator import CoordinatorStore, NoCapacity, SessionRejected, rank_nodes
from adx.embedded import EmbeddedRedis
from adx.errors import ConflictError, NotFoundError, UnavailableError
from adx.model import EnvironmentRecord, EnvironmentSpec, EnvironmentState, Resources, new_id

GiB = 2**30


@pytest.fixture
async def redis_server(redis_factory: Callable[..., EmbeddedRedis]) -> EmbeddedRedis:  # type: ignore[override]
    return redis_factory()


@pytest.fixture
async def store(redis_server: EmbeddedRedis) -> AsyncIterator[CoordinatorStore]:
    info = redis_server.read_info()
    assert info is not None
    store = CoordinatorStore.from_url(info.url, timeout=2)
    yield store
    await store.close()


def record(tenant: str = "acme", node: str = "n1", cpu: int = 1000, mem: int = GiB) -> EnvironmentRecord:
    now = time.time()
    return EnvironmentRecord(
        id=new_id("env"),
        tenant=tenant,
        spec=EnvironmentSpec(resources=Resources(cpu_millis=cpu, memory_bytes=mem)),
        state=EnvironmentState.PENDING,
        node=node,
        generation=1,
        revision=1,
        created_at=now,
        updated_at=now,
    )


async def ready_node(store: CoordinatorStore, name: str = "n1", cpu: int = 4000, mem: int = 8 * GiB) -> str:
    session = new_id("ses")
    await store.register_node(name, session=session, address=f"{name}:1", session_ttl=60)
    await store.report_capacity(name, session, Resources(cpu_millis=cpu, memory_bytes=mem, disk_bytes=0), valid_for=30)
    return session


@pytest.mark.req("SEC-2")
async def test_api_keys_are_stored_only_as_hashes(store: CoordinatorStore, redis_server: EmbeddedRedis) -> None:
    key = await store.create_tenant("acme")
    assert await store.authenticate(key) == "acme"
    with pytest.raises(NotFoundError):
        await store.authenticate(key + "x")
    raw = store._redis
    for name in await raw.keys("*"):
        assert key.encode() not in name
        if await raw.type(name) == b"string":
            assert key.encode() not in (await raw.get(name) or b"")


@pytest.mark.req("SEC-2")
async def test_other_tenants_environment_is_not_found(store: CoordinatorStore) -> None:
    await ready_node(store)
    mine = (await store.create_environment(record("acme"))).record
    assert (await store.get_tenant_environment("acme", mine.id)).id == mine.id
    with pytest.raises(NotFoundError, match="not found"):
        await store.get_tenant_environment("other", mine.id)
    assert await store.list_environments("other") == []
    assert [r.id for r in await store.list_environments("acme")] == [mine.id]


@pytest.mark.req("RES-4")
async def test_create_reserves_and_refuses_beyond_allocatable(store: CoordinatorStore) -> None:
    await ready_node(store, cpu=2000, mem=2 * GiB)
    await store.create_environment(record(cpu=1500, mem=GiB))
    node = await store.get_node("n1")
    assert node.reserved == Resources(cpu_millis=1500, memory_bytes=GiB)
    with pytest.raises(NoCapacity, match="no capacity: cpu"):
        await store.create_environment(record(cpu=600, mem=GiB))
    with pytest.raises(NoCapacity, match="no capacity: memory"):
        await store.create_environment(record(cpu=100, mem=GiB + 1))
    assert (await store.get_node("n1")).reserved == Resources(cpu_millis=1500, memory_bytes=GiB)


@pytest.mark.req("RES-4", "RES-5")
async def test_capacity_sample_never_touches_reservations(store: CoordinatorStore) -> None:
    session = await ready_node(store, cpu=2000, mem=2 * GiB)
    await store.create_environment(record(cpu=1500, mem=GiB))
    # A drop below the reservations is allowed and changes nothing already reserved.
    await store.report_capacity("n1", session, Resources(cpu_millis=1000), valid_for=30)
    node = await store.get_node("n1")
    assert node.capacity == Resources(cpu_millis=1000)
    assert node.reserved == Resources(cpu_millis=1500, memory_bytes=GiB)
    with pytest.raises(NoCapacity):
        await store.create_environment(record(cpu=1, mem=1))


@pytest.mark.req("RES-4", "RES-6")
async def test_zero_capacity_and_expired_sample_and_closed_admission_get_nothing(store: CoordinatorStore) -> None:
    session = await ready_node(store, "zero", cpu=0, mem=0)
    with pytest.raises(NoCapacity, match="no capacity: cpu,memory"):
        await store.create_environment(record(node="zero"))
    await store.report_capacity("zero", session, Resources(cpu_millis=4000, memory_bytes=4 * GiB), valid_for=-1)
    with pytest.raises(NoCapacity, match="capacity sample expired"):
        await store.create_environment(record(node="zero"))
    await store.report_capacity(
        "zero", session, Resources(cpu_millis=4000, memory_bytes=4 * GiB), valid_for=30, admission_open=False
    )
    with pytest.raises(NoCapacity, match="admission closed"):
        await store.create_environment(record(node="zero"))
    with pytest.raises(NoCapacity, match="unknown node"):
        await store.create_environment(record(node="ghost"))


async def test_concurrent_creates_never_overcommit(store: CoordinatorStore) -> None:
    await ready_node(store, cpu=10_000, mem=100 * GiB)
    results = await asyncio.gather(
        *(store.create_environment(record(cpu=1000, mem=GiB)) for _ in range(20)), return_exceptions=True
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, NoCapacity)]
    assert (len(created), len(refused)) == (10, 10)
    node = await store.get_node("n1")
    assert node.reserved == Resources(cpu_millis=10_000, memory_bytes=10 * GiB)
    assert len(await store.node_reservations("n1")) == 10


async def test_idempotent_create_returns_the_first_environment(store: CoordinatorStore) -> None:
    await ready_node(store)
    first = await store.create_environment(record(), idempotency="req-1")
    again = await store.create_environment(record(), idempotency="req-1")
    assert first.created and not again.created
    assert again.record.id == first.record.id
    assert (await store.get_node("n1")).reserved == first.record.spec.resources
    other_tenant = await store.create_environment(record(tenant="other"), idempotency="req-1")
    assert other_tenant.created


async def test_commit_is_compare_and_set_on_revision_and_generation(store: CoordinatorStore) -> None:
    await ready_node(store)
    created = (await store.create_environment(record())).record
    running = await store.commit_environment(created, {"state": EnvironmentState.STARTING})
    assert running.revision == 2
    with pytest.raises(ConflictError, match="stale revision"):
        await store.commit_environment(created, {"state": EnvironmentState.FAILED})
    stale_generation = running.model_copy(update={"generation": 7})
    with pytest.raises(ConflictError, match="stale generation"):
        await store.commit_environment(stale_generation, {"state": EnvironmentState.RUNNING})
    stored = await store.get_environment(created.id)
    assert (stored.state, stored.revision) == (EnvironmentState.STARTING, 2)


async def test_delete_releases_reservation_and_leaves_the_list(store: CoordinatorStore) -> None:
    await ready_node(store)
    created = (await store.create_environment(record())).record
    deleting = await store.commit_environment(created, {"state": EnvironmentState.DELETING})
    deleted = await store.commit_environment(deleting, {"state": EnvironmentState.DELETED})
    assert deleted.state is EnvironmentState.DELETED
    assert (await store.get_node("n1")).reserved == Resources()
    assert await store.node_reservations("n1") == {}
    assert await store.list_environments("acme") == []
    assert (await store.get_environment(created.id)).state is EnvironmentState.DELETED
    # A late commit of an older revision cannot revive it.
    with pytest.raises(ConflictError):
        await store.commit_environment(deleting, {"state": EnvironmentState.RUNNING})


async def test_commits_publish_routes_in_order(store: CoordinatorStore) -> None:
    await ready_node(store)
    pubsub = store._redis.pubsub()
    await pubsub.subscribe("adx:routes")
    await pubsub.get_message(timeout=1)  # the subscribe confirmation
    created = (await store.create_environment(record())).record
    starting = await store.commit_environment(created, {"state": EnvironmentState.STARTING})
    await store.commit_environment(starting, {"state": EnvironmentState.RUNNING})
    seen = []
    while len(seen) < 3:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2)
        assert message is not None
        seen.append(json.loads(message["data"]))
    assert [(m["state"], m["revision"]) for m in seen] == [("pending", 1), ("starting", 2), ("running", 3)]
    await pubsub.aclose()


@pytest.mark.req("NOD-6")
async def test_heartbeat_and_capacity_need_the_registered_session(store: CoordinatorStore) -> None:
    old = await ready_node(store)
    new = new_id("ses")
    assert await store.register_node("n1", session=new, address="n1:1") == old
    with pytest.raises(SessionRejected):
        await store.heartbeat("n1", old)
    with pytest.raises(SessionRejected):
        await store.report_capacity("n1", old, Resources(), valid_for=30)
    await store.heartbeat("n1", new)
    with pytest.raises(NotFoundError):
        await store.heartbeat("ghost", new)


async def test_acknowledged_writes_survive_sigkill_of_redis(
    store: CoordinatorStore, redis_server: EmbeddedRedis
) -> None:
    await ready_node(store)
    created = [(await store.create_environment(record(cpu=100, mem=GiB // 8))).record for _ in range(5)]
    committed = await store.commit_environment(created[0], {"state": EnvironmentState.RUNNING})
    redis_server.send_signal(signal.SIGKILL)
    redis_server.wait_exited()
    with pytest.raises(UnavailableError):
        await store.get_environment(created[0].id)
    info = redis_server.start()
    fresh = CoordinatorStore.from_url(info.url)
    try:
        assert await fresh.get_environment(created[0].id) == committed
        assert {r.id for r in await fresh.list_environments("acme")} == {r.id for r in created}
        assert (await fresh.get_node("n1")).reserved == Resources(cpu_millis=500, memory_bytes=5 * (GiB // 8))
    finally:
        await fresh.close()


async def test_ranking_prefers_room_and_explains_refusals(store: CoordinatorStore) -> None:
    await ready_node(store, "small", cpu=2000, mem=2 * GiB)
    await ready_node(store, "big", cpu=8000, mem=16 * GiB)
    await ready_node(store, "empty", cpu=0, mem=0)
    nodes = await store.list_nodes()
    ranked, refused = rank_nodes(nodes, Resources(cpu_millis=1000, memory_bytes=GiB), time.time())
    assert [n.name for n in ranked] == ["big", "small"]
    assert [(r.node, r.reason) for r in refused] == [("empty", "no capacity: cpu,memory")]
    _, refused = rank_nodes(nodes, Resources(cpu_millis=1, memory_bytes=1), time.time(), needs_checkpoint=True)
    assert {r.reason for r in refused} >= {"node cannot checkpoint (idleAction pause needs it)"}
