"""Coordinator high availability with real processes: two ``adx coordinator`` replicas on one real Redis, one
active under a fenced lease; clients follow the active one through ``adx._coordinator_channel`` (real gRPC
with mutual TLS). The active replica is SIGKILLed under load, or SIGSTOPped and later SIGCONTed (fencing)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from ha_helpers import HaCluster, make_cluster

from adx._certs import Identity, issue
from adx._grpc_tls import channel_credentials
from adx.coordinator import CoordinatorStore
from adx.coordinator._lease import LEASE_KEY, LeaderLease, token_of
from adx.coordinator._redis_store import NotLeader
from adx.coordinator._store import env_key, hash_api_key, tenant_index_key
from adx.embedded import EmbeddedRedis
from adx.model import EnvironmentRecord, EnvironmentSpec, EnvironmentState, Resources, new_id
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc

#: What a client may see during a failover and must retry (the same idempotency key for a create).
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN}
SPEC = EnvironmentSpec(resources=Resources(cpu_millis=10, memory_bytes=2**20)).model_dump_json(by_alias=True)


@pytest.fixture
async def ha(redis_factory: Callable[..., EmbeddedRedis], tmp_path: Path) -> AsyncIterator[HaCluster]:
    info = redis_factory().read_info()
    assert info is not None
    cluster = make_cluster(tmp_path, info.url, lease_seconds=2.0)
    yield cluster
    await cluster.close()


async def start_pair(ha: HaCluster) -> None:
    """Replica a active (it starts first), then replica b standing by."""
    a, b = ha.replicas
    a.start()
    await ha.wait_active(a)
    b.start()
    await wait_for_log(b, "standing by")


async def wait_for_log(replica: object, text: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while text not in replica.log_text():  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{replica.log_text()[-3000:]}"  # type: ignore[attr-defined]
        await asyncio.sleep(0.05)


@dataclass
class Ledger:
    """What the clients were told: per idempotency key every reply, per Environment the acknowledged record."""

    replies: dict[str, list[tuple[str, bool]]] = field(default_factory=lambda: defaultdict(list))
    acked: dict[str, EnvironmentRecord] = field(default_factory=dict)
    successes: list[float] = field(default_factory=list)  # monotonic times of successful calls
    retried: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)


async def load(
    stub: coordinator_pb2_grpc.CoordinatorStub, tenant: str, worker: int, ledger: Ledger, stop: asyncio.Event
) -> None:
    """Create (with an idempotency key, retried with the same key on retryable errors) then read, in a loop."""
    n = 0
    while not stop.is_set():
        key, n = f"w{worker}-{n}", n + 1
        request = pb.CreateEnvironmentRequest(tenant=tenant, spec_json=SPEC, idempotency_key=key)
        record = None
        for _ in range(400):
            try:
                reply = await stub.CreateEnvironment(request, timeout=5)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE:
                    ledger.unexpected.append(f"create {key}: {exc.code().name}: {exc.details()}")
                    return
                ledger.retried[exc.code().name] += 1
                await asyncio.sleep(0.05)
                continue
            record = EnvironmentRecord.model_validate_json(reply.environment_json)
            ledger.replies[key].append((record.id, bool(reply.created)))
            ledger.acked.setdefault(record.id, record)
            ledger.successes.append(time.monotonic())
            break
        if record is None:
            ledger.unexpected.append(f"create {key}: never succeeded")
            return
        try:
            got = await stub.GetEnvironment(pb.EnvironmentRequest(tenant=tenant, environment_id=record.id), timeout=5)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRYABLE:
                ledger.unexpected.append(f"get {record.id}: {exc.code().name}: {exc.details()}")
                return
            ledger.retried[exc.code().name] += 1
            continue
        ledger.successes.append(time.monotonic())
        seen = EnvironmentRecord.model_validate_json(got.environment_json)
        if (seen.node, seen.generation) != (record.node, record.generation):
            ledger.unexpected.append(f"get {record.id}: owner {seen.node}/{seen.generation} != {record.node}")


@pytest.mark.req("CRD-2", "CRD-7")
async def test_sigkilled_active_replica_under_load_loses_and_duplicates_nothing(ha: HaCluster) -> None:
    """The active replica is SIGKILLed while four clients create and read Environments through the
    failover-aware channel: the standby takes over within a few seconds; every create was acknowledged for
    exactly one Environment per idempotency key (created=True at most once), every acknowledged Environment is
    in Redis with the owner and generation it was acknowledged with, and no node was handed one twice."""
    a, b = ha.replicas
    await start_pair(ha)
    await ha.add_node("n1")
    await ha.add_node("n2")
    api = ha.api()
    tenant = "acme"
    await api.CreateTenant(pb.CreateTenantRequest(name=tenant), timeout=10)

    ledger, stop = Ledger(), asyncio.Event()
    workers = [asyncio.create_task(load(api, tenant, i, ledger, stop)) for i in range(4)]
    await asyncio.sleep(1.5)
    before = len(ledger.acked)
    killed_at = time.monotonic()
    a.kill()
    await ha.wait_active(b, within=20)
    while not [t for t in ledger.successes if t > killed_at] and not ledger.unexpected:
        assert time.monotonic() - killed_at < 20, "no call succeeded after the failover"
        await asyncio.sleep(0.02)
    failover = min(t for t in ledger.successes if t > killed_at) - killed_at
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.gather(*workers)

    assert not ledger.unexpected, ledger.unexpected
    assert before > 0 and len(ledger.acked) > before, (before, len(ledger.acked))
    for key, replies in ledger.replies.items():
        assert len({env_id for env_id, _ in replies}) == 1, (key, replies)
        assert sum(created for _, created in replies) <= 1, (key, replies)
    # Redis holds every acknowledged Environment, owned as acknowledged, and nothing else.
    r = aioredis.Redis.from_url(ha.redis_url)
    try:
        stored_ids = {raw.decode() for raw in await r.zrange(tenant_index_key(tenant), 0, -1)}
        assert stored_ids == set(ledger.acked), (len(stored_ids), len(ledger.acked))
        for env_id, acked in ledger.acked.items():
            stored = EnvironmentRecord.model_validate_json(await r.hget(env_key(env_id), "doc"))
            assert (stored.node, stored.generation) == (acked.node, acked.generation)
    finally:
        await r.aclose()
    handed = Counter[str]()
    for name, node in ha.nodes.items():
        handed.update(node.admitted)
        assert all(owner == name for owner in node.owner.values())
    assert max(handed.values()) == 1
    assert a.alive() is False and b.alive()
    assert failover < 10, failover
    print(f"failover {failover:.2f}s, {len(ledger.acked)} environments, retried {dict(ledger.retried)}")


@pytest.mark.req("CRD-2")
async def test_frozen_active_replica_loses_the_lease_and_writes_nothing_after_sigcont(ha: HaCluster) -> None:
    """SIGSTOP the active replica: the standby takes the lease after its TTL and serves (the frozen one keeps
    its port open; the client skips it). After SIGCONT the old replica is refused: its own calls answer
    "standby", Redis refuses a write under its old lease (fencing), and it goes back to standing by."""
    a = ha.replicas[0]
    await start_pair(ha)
    r = aioredis.Redis.from_url(ha.redis_url)
    try:
        old_lease = (await r.get(LEASE_KEY)).decode()
        # A client already talking to the active replica: its next read hangs on the frozen one until its
        # deadline, then the channel looks again (skipping the frozen replica) and the read goes to b.
        api = ha.api(probe_timeout=0.5)
        await api.ListEnvironments(pb.ListEnvironmentsRequest(tenant="nobody"), timeout=10)
        a.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as hung:
            await api.ListEnvironments(pb.ListEnvironmentsRequest(tenant="nobody"), timeout=2)
        assert hung.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await api.ListEnvironments(pb.ListEnvironmentsRequest(tenant="nobody"), timeout=30)
        took_over = time.monotonic() - frozen_at
        await api.CreateTenant(pb.CreateTenantRequest(name="during-freeze"), timeout=10)
        new_lease = (await r.get(LEASE_KEY)).decode()
        assert token_of(new_lease) > token_of(old_lease)
        assert took_over < 10, took_over

        # Fencing in Redis: a write carrying the frozen replica's lease value is refused, nothing changes.
        stale = CoordinatorStore.from_url(ha.redis_url, timeout=2)
        lost: list[str] = []
        stale.fence_with(old_lease, lost.append)
        with pytest.raises(NotLeader):
            await stale.create_tenant("stale-writer")
        await stale.close()
        assert lost == [new_lease]
        assert not await r.sismember("adx:tenants", "stale-writer")

        # The thawed replica answers nothing as active and stands by again.
        a.signal(signal.SIGCONT)
        credentials = channel_credentials(issue(ha.certs, Identity("api", "main")))
        async with grpc.aio.secure_channel(a.target, credentials) as direct:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await coordinator_pb2_grpc.CoordinatorStub(direct).CreateTenant(
                    pb.CreateTenantRequest(name="after-thaw"), timeout=5
                )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        await wait_for_log(a, "lost the leader lease")
        await wait_for_log(a, "standing by again")
        assert a.alive()
        assert not await r.sismember("adx:tenants", "after-thaw")
        assert (await r.get(LEASE_KEY)).decode() == new_lease  # b still holds it: a wrote nothing
        reply = await api.CreateTenant(pb.CreateTenantRequest(name="after-thaw-via-b"), timeout=10)
        assert await r.get(f"adx:apikey:{hash_api_key(reply.api_key)}") == b"after-thaw-via-b"
    finally:
        await r.aclose()


@pytest.mark.req("CRD-2")
async def test_clean_stop_hands_the_lease_over_at_once(ha: HaCluster) -> None:
    """SIGTERM releases the lease: the standby is active well before the TTL would have expired."""
    a, b = ha.replicas
    await start_pair(ha)
    stopped_at = time.monotonic()
    a.signal(signal.SIGTERM)
    active_at = await ha.wait_active(b, within=10)
    assert active_at - stopped_at < 1.5, active_at - stopped_at
    assert a.process is not None and a.process.wait(10) == 0


async def test_every_store_write_is_fenced(redis_factory: Callable[..., EmbeddedRedis]) -> None:
    """Each write of the store, carrying a lease value that is no longer the holder's, is refused by Redis
    inside its own script and changes nothing; with the current value the same writes go through."""
    info = redis_factory().read_info()
    assert info is not None
    old = LeaderLease(info.url, ttl=1.0, redis_timeout=2)
    new = LeaderLease(info.url, ttl=30.0, redis_timeout=2)
    setup = CoordinatorStore.from_url(info.url)
    try:
        session = new_id("ses")
        await setup.register_node("n1", session=session, address="x:1", session_ttl=600)
        await setup.report_capacity("n1", session, Resources(cpu_millis=10**6, memory_bytes=2**40), valid_for=600)
        now = time.time()
        record = EnvironmentRecord(
            id=new_id("env"),
            tenant="acme",
            spec=EnvironmentSpec(resources=Resources(cpu_millis=10, memory_bytes=2**20)),
            state=EnvironmentState.PAUSED,
            node="n1",
            generation=1,
            revision=1,
            created_at=now,
            updated_at=now,
        )
        await setup.create_environment(record)
        assert await old.try_acquire() is None
        await asyncio.sleep(1.1)  # the old lease expires in Redis
        assert await new.try_acquire() is None
        r = aioredis.Redis.from_url(info.url)
        before = {k: await r.dump(k) for k in await r.keys("*") if k != LEASE_KEY.encode()}

        stale = CoordinatorStore.from_url(info.url)
        assert old.value is not None and new.value is not None
        stale.fence_with(old.value, lambda holder: None)
        writes = [
            lambda s: s.create_tenant("t2"),
            lambda s: s.create_environment(record.model_copy(update={"id": new_id("env")})),
            lambda s: s.commit_environment(record, {"state": EnvironmentState.DELETED}),
            lambda s: s.record_resume_intent(record, {}, node="n1", generation=2),
            lambda s: s.forget_checkpoint("ckpt-x"),
            lambda s: s.register_node("n2", session="s", address="y:1"),
            lambda s: s.heartbeat("n1", session),
            lambda s: s.report_capacity("n1", session, Resources(cpu_millis=1), valid_for=1),
        ]
        for write in writes:
            with pytest.raises(NotLeader):
                await write(stale)
        after = {k: await r.dump(k) for k in await r.keys("*") if k != LEASE_KEY.encode()}
        assert after == before
        current = CoordinatorStore.from_url(info.url)
        current.fence_with(new.value, lambda holder: None)
        await current.heartbeat("n1", session)
        assert await current.create_tenant("t3")
        await stale.close()
        await current.close()
        await r.aclose()
    finally:
        await setup.close()
        await old.close()
        await new.close()


@pytest.mark.req("CRD-2", "JRN-4")
async def test_a_route_stream_on_a_frozen_replica_ends_and_the_next_one_follows_the_new_active(ha: HaCluster) -> None:
    """An API/Ingress follows route publications on the active replica, which is then SIGSTOPped (its TCP port
    stays open, so nothing on the wire fails): the stream ends UNAVAILABLE after ROUTE_STREAM_SILENCE_SECONDS
    without the Coordinator's heartbeats, instead of hanging for as long as the replica is frozen, and the
    reconnect reaches the replica that took the lease over. Heartbeats never reach the caller as routes."""
    from adx.errors import UnavailableError
    from adx.gateway._coordinator import ROUTE_STREAM_SILENCE_SECONDS, CoordinatorClient

    a = ha.replicas[0]
    await start_pair(ha)
    credentials = channel_credentials(issue(ha.certs, Identity("api", "main")))
    client = CoordinatorClient(ha.targets, credentials, timeout=5, create_timeout=5)
    seen: list[pb.RouteEvent] = []
    ended: list[BaseException] = []

    async def follow() -> None:
        try:
            async for event in client.watch_routes():
                seen.append(event)
        except BaseException as exc:
            ended.append(exc)
            raise

    try:
        follower = asyncio.create_task(follow())
        deadline = time.monotonic() + 10
        while not seen:
            assert time.monotonic() < deadline, "no resync on the first stream"
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.5)  # two heartbeats went by
        assert [event.resync for event in seen] == [True], seen
        a.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        with pytest.raises(UnavailableError, match="frozen replica"):
            await asyncio.wait_for(follower, ROUTE_STREAM_SILENCE_SECONDS + 10)
        silence = time.monotonic() - frozen_at
        assert ROUTE_STREAM_SILENCE_SECONDS - 1.5 < silence < ROUTE_STREAM_SILENCE_SECONDS + 5, silence
        # The reconnect finds the replica that took the lease over while a is still frozen.
        again = client.watch_routes()
        first = await asyncio.wait_for(again.__anext__(), 30)
        assert first.resync
        await again.aclose()
        assert a.alive()
    finally:
        a.signal(signal.SIGCONT)
        await client.close()
