"""The Coordinator's node-facing gRPC service: real Redis, real gRPC with mutual TLS."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import grpc
import pytest

from adx._grpc_errors import from_rpc_error
from adx.coordinator import CoordinatorStore
from adx.errors import ConflictError, InvalidInputError, NotFoundError, UnavailableError, UncertainOutcomeError
from adx.model import EnvironmentRecord, EnvironmentSpec, EnvironmentState, Resources, new_id
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc as pb_grpc

GiB = 2**30


def new_record(node: str, tenant: str = "acme") -> EnvironmentRecord:
    now = time.time()
    return EnvironmentRecord(
        id=new_id("env"),
        tenant=tenant,
        spec=EnvironmentSpec(resources=Resources(cpu_millis=500, memory_bytes=GiB)),
        state=EnvironmentState.PENDING,
        node=node,
        generation=1,
        revision=1,
        created_at=now,
        updated_at=now,
    )


def seeder(node: str, count: int):
    async def seed(url: str) -> list[EnvironmentRecord]:
        return await seed_environments(url, node, count)

    return seed


async def seed_environments(url: str, node: str, count: int) -> list[EnvironmentRecord]:
    """Environments created through the store before the Coordinator starts (it must load them)."""
    store = CoordinatorStore.from_url(url)
    session = new_id("ses")
    await store.register_node(node, session=session, address="x:1", session_ttl=60)
    await store.report_capacity(node, session, Resources(cpu_millis=64_000, memory_bytes=256 * GiB), valid_for=60)
    records = [(await store.create_environment(new_record(node))).record for _ in range(count)]
    await store.close()
    return records


async def call(what: str, coro):
    try:
        return await coro
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc, what) from None


async def register(stub: pb_grpc.CoordinatorStub, node: str) -> str:
    session = new_id("ses")
    await call("register", stub.RegisterNode(pb.RegisterNodeRequest(node=node, session=session, address="x:1")))
    return session


@pytest.mark.req("CRD-2", "CRD-4", "SEC-1")
async def test_inspect_node_serves_the_loaded_catalog_to_its_own_node_only(coordinator_cluster) -> None:
    cluster, seeded = await coordinator_cluster(before_start=seeder("n1", 3))
    channel, stub = cluster.stub("n1")
    session = await register(stub, "n1")
    reply = await call("inspect", stub.InspectNode(pb.InspectNodeRequest(node="n1", session=session)))
    catalog = [EnvironmentRecord.model_validate_json(doc) for doc in reply.environment_json]
    assert sorted(r.id for r in catalog) == sorted(r.id for r in seeded)

    # Another node's certificate cannot read n1's catalog, even with n1's session.
    other_channel, other = cluster.stub("n2")
    with pytest.raises(InvalidInputError, match="certificate is for node n2, not n1"):
        await call("inspect", other.InspectNode(pb.InspectNodeRequest(node="n1", session=session)))
    # A stale session is refused.
    with pytest.raises(ConflictError, match="session is not the registered one"):
        await call("inspect", stub.InspectNode(pb.InspectNodeRequest(node="n1", session=new_id("ses"))))
    await channel.close()
    await other_channel.close()


@pytest.mark.req("SEC-1")
async def test_a_caller_without_a_client_certificate_is_refused(coordinator_cluster) -> None:
    cluster, _ = await coordinator_cluster()
    ca = (cluster.certs / "ca.pem").read_bytes()
    async with grpc.aio.secure_channel(
        f"localhost:{cluster.coordinator.port}", grpc.ssl_channel_credentials(root_certificates=ca)
    ) as channel:
        with pytest.raises(UnavailableError):
            await call("register", register(pb_grpc.CoordinatorStub(channel), "n1"))


@pytest.mark.req("CRD-4")
async def test_inspect_needs_an_unexpired_session_but_not_closed_admission(coordinator_cluster) -> None:
    cluster, _ = await coordinator_cluster(session_ttl=0.5)
    channel, stub = cluster.stub("n1")
    session = await register(stub, "n1")
    capacity = Resources(cpu_millis=1000, memory_bytes=GiB).model_dump_json(by_alias=True)
    await call(
        "capacity",
        stub.ReportCapacity(
            pb.ReportCapacityRequest(
                node="n1", session=session, capacity_json=capacity, valid_for_seconds=30, admission_open=True
            )
        ),
    )
    # Admission open: inspect works (it does not require closing admission).
    await call("inspect", stub.InspectNode(pb.InspectNodeRequest(node="n1", session=session)))
    await asyncio.sleep(0.7)
    with pytest.raises(ConflictError, match="session expired"):
        await call("inspect", stub.InspectNode(pb.InspectNodeRequest(node="n1", session=session)))
    await call("heartbeat", stub.Heartbeat(pb.HeartbeatRequest(node="n1", session=session)))
    await call("inspect", stub.InspectNode(pb.InspectNodeRequest(node="n1", session=session)))
    await channel.close()


@pytest.mark.req("CRD-2")
async def test_catalog_is_served_from_cache_while_redis_is_down(coordinator_cluster) -> None:
    cluster, seeded = await coordinator_cluster(redis_timeout=1.0, before_start=seeder("n1", 2))
    channel, stub = cluster.stub("n1")
    session = await register(stub, "n1")
    cluster.redis.send_signal(signal.SIGKILL)
    cluster.redis.wait_exited()
    reply = await call("inspect", stub.InspectNode(pb.InspectNodeRequest(node="n1", session=session)))
    assert len(reply.environment_json) == 2
    # A commit cannot be made without Redis, and says so.
    request = pb.CommitResultRequest(
        node="n1",
        session=session,
        environment_id=seeded[0].id,
        expected_revision=1,
        expected_generation=1,
        changes_json=json.dumps({"state": "starting"}),
    )
    # Unavailable (never sent) or uncertain (the dead connection took it): never a success.
    with pytest.raises((UnavailableError, UncertainOutcomeError)):
        await call("commit", stub.CommitResult(request))
    cluster.redis.start()
    reply = await call("commit", stub.CommitResult(request))
    assert EnvironmentRecord.model_validate_json(reply.environment_json).revision == 2
    await channel.close()


@pytest.mark.req("CRD-2")
async def test_uncertain_commit_invalidates_the_catalog_until_reloaded(coordinator_cluster) -> None:
    cluster, seeded = await coordinator_cluster(redis_timeout=0.3, before_start=seeder("n1", 1))
    channel, stub = cluster.stub("n1")
    session = await register(stub, "n1")
    info = cluster.redis.read_info()
    assert info is not None
    admin = CoordinatorStore.from_url(info.url)
    # Writes are held for 1 s: the Coordinator's commit times out after sending, so its outcome is unknown.
    await admin._redis.execute_command("CLIENT", "PAUSE", "1000", "WRITE")
    request = pb.CommitResultRequest(
        node="n1",
        session=session,
        environment_id=seeded[0].id,
        expected_revision=1,
        expected_generation=1,
        changes_json=json.dumps({"state": "starting"}),
    )
    with pytest.raises(UncertainOutcomeError, match="outcome unknown"):
        await call("commit", stub.CommitResult(request))
    await asyncio.sleep(1.1)
    # Meanwhile the authority moved on (another writer); the Coordinator's cache still holds revision 1.
    stored = await admin.get_environment(seeded[0].id)
    await admin.commit_environment(stored, {"state": EnvironmentState.FAILED})
    await admin.close()
    cluster.redis.send_signal(signal.SIGKILL)
    cluster.redis.wait_exited()
    # The invalidated catalog is not served from the stale cache while it cannot be reloaded...
    with pytest.raises(UnavailableError):
        await call("inspect", stub.InspectNode(pb.InspectNodeRequest(node="n1", session=session)))
    cluster.redis.start()
    # ...and once Redis is back it is reloaded and shows what Redis holds.
    reply = await call("inspect", stub.InspectNode(pb.InspectNodeRequest(node="n1", session=session)))
    (record,) = [EnvironmentRecord.model_validate_json(doc) for doc in reply.environment_json]
    assert (record.revision, record.state) == (stored.revision + 1, EnvironmentState.FAILED)
    await channel.close()


async def test_commit_result_checks_owner_version_and_fields(coordinator_cluster) -> None:
    cluster, seeded = await coordinator_cluster(before_start=seeder("n1", 1))
    env = seeded[0]
    channel, stub = cluster.stub("n1")
    session = await register(stub, "n1")
    other_channel, other = cluster.stub("n2")
    other_session = await register(other, "n2")

    def commit(node: str, sess: str, revision: int, changes: dict[str, object]) -> pb.CommitResultRequest:
        return pb.CommitResultRequest(
            node=node,
            session=sess,
            environment_id=env.id,
            expected_revision=revision,
            expected_generation=1,
            changes_json=json.dumps(changes),
        )

    with pytest.raises(NotFoundError, match="not owned by node n2"):
        await call("commit", other.CommitResult(commit("n2", other_session, 1, {"state": "running"})))
    with pytest.raises(InvalidInputError) as caught:
        await call("commit", stub.CommitResult(commit("n1", session, 1, {"node": "n2"})))
    assert caught.value.field == "changesJson.node"
    with pytest.raises(InvalidInputError) as caught:
        await call("commit", stub.CommitResult(commit("n1", session, 1, {"state": "sleeping"})))
    assert caught.value.field == "state"
    reply = await call("commit", stub.CommitResult(commit("n1", session, 1, {"state": "starting"})))
    assert EnvironmentRecord.model_validate_json(reply.environment_json).state is EnvironmentState.STARTING
    with pytest.raises(ConflictError, match="stale result"):
        await call("commit", stub.CommitResult(commit("n1", session, 1, {"state": "running"})))
    # A transition the state table forbids is refused even at the right revision (a node whose record diverged).
    with pytest.raises(ConflictError, match="cannot go from starting to paused"):
        await call("commit", stub.CommitResult(commit("n1", session, 2, {"state": "paused"})))
    reply = await call("commit", stub.CommitResult(commit("n1", session, 2, {"state": "running"})))
    assert EnvironmentRecord.model_validate_json(reply.environment_json).state is EnvironmentState.RUNNING
    await channel.close()
    await other_channel.close()


@pytest.mark.req("CRD-2")
async def test_a_commit_between_two_inspects_is_served_by_the_second(coordinator_cluster) -> None:
    """Issue 16: InspectNode reuses each record's wire form while the record is unchanged; a commit (the node's
    own, or one interleaved with concurrent InspectNode calls) is in the next reply."""
    cluster, seeded = await coordinator_cluster(before_start=seeder("n1", 3))
    channel, stub = cluster.stub("n1")
    session = await register(stub, "n1")

    async def inspect() -> dict[str, EnvironmentRecord]:
        reply = await call("inspect", stub.InspectNode(pb.InspectNodeRequest(node="n1", session=session)))
        records = [EnvironmentRecord.model_validate_json(doc) for doc in reply.environment_json]
        return {r.id: r for r in records}

    def commit(env: EnvironmentRecord, revision: int, state: str) -> pb.CommitResultRequest:
        return pb.CommitResultRequest(
            node="n1",
            session=session,
            environment_id=env.id,
            expected_revision=revision,
            expected_generation=1,
            changes_json=json.dumps({"state": state}),
        )

    env = seeded[0]
    assert (await inspect())[env.id].state is EnvironmentState.PENDING
    await call("commit", stub.CommitResult(commit(env, 1, "starting")))
    second = await inspect()
    assert (second[env.id].revision, second[env.id].state) == (2, EnvironmentState.STARTING)
    assert {r.revision for r in second.values()} == {1, 2}

    # Commits racing InspectNode calls: every reply shows each record at a revision no older than the one
    # committed before that call began, and the last reply shows what was committed last.
    revision = 2
    for state in ("running", "failed", "starting", "running"):
        committed_before = revision
        seen, _ = await asyncio.gather(inspect(), call("commit", stub.CommitResult(commit(env, revision, state))))
        assert seen[env.id].revision >= committed_before
        revision += 1
        assert (await inspect())[env.id].revision == revision
    final = (await inspect())[env.id]
    assert (final.revision, final.state) == (6, EnvironmentState.RUNNING)
    await channel.close()
