"""An infrastructure blip never fails a user's create (issue 12): a create the cluster cannot take now is refused
before anything is committed, with a retryable 503 and Retry-After, and nothing of it remains; a node that is not
admitting for a passing reason never turns a create into a Failed Environment."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from apistack import STEP, ApiStack

import adx
from adx.proto import coordinator_pb2 as pb

SPEC: dict[str, Any] = {"resources": {"cpuMillis": 250, "memoryBytes": 256 * 2**20}}


async def stored(stack: ApiStack) -> list[Any]:
    """Every Environment record in the Coordinator's Redis (the authority)."""
    return list(await stack.cluster.coordinator.store.load_all_environments())


async def reserved_cpu(stack: ApiStack, node: str) -> int:
    return int((await stack.cluster.coordinator.store.get_node(node)).reserved.cpu_millis)


def assert_retryable_503(response: Any, code: str | None = None) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    if code is not None:
        assert error["code"] == code, error
    retry_after = int(response.headers["retry-after"])
    assert retry_after >= 1
    assert error["details"]["retry_after_seconds"] >= 1


def stop_reporting(agent: Any) -> None:
    """The node keeps serving but its reports stop reaching the Coordinator and it stops admitting (as in the
    moments after the Coordinator restarted): the Coordinator's view still says "admitting"."""

    async def silent() -> None:
        return None

    agent.reporter.report_once = silent
    agent.reporter.state.coordinator_reachable = False


def resume_reporting(agent: Any) -> None:
    del agent.reporter.report_once  # the class's own method again


@pytest.mark.req("ENV-1")
async def test_a_create_while_redis_is_down_is_a_retryable_503_and_leaves_nothing(node_cluster, api_for) -> None:
    nc = await node_cluster(redis_timeout=1.0)
    stack: ApiStack = await api_for(nc.cluster, auth_cache_seconds=60)
    key = await stack.tenant("alpha")
    redis = nc.cluster.redis
    async with stack.http(key) as http:
        # The tenant's key is known (the API caches it briefly), so the creates below reach the create path.
        assert (await http.get("/v1/environments")).status_code == 200
        redis.send_signal(9)
        redis.wait_exited()
        # At once (pooled connections still look alive: the write's outcome is uncertain), then once the
        # Coordinator has noticed (connections refused): both are refused, never 201 or 504.
        at_once = await http.post("/v1/environments", json=SPEC, headers={"Idempotency-Key": "k-1"})
        assert_retryable_503(at_once, "not_admitting")
        await asyncio.sleep(1.0)
        later = await http.post("/v1/environments", json=SPEC, headers={"Idempotency-Key": "k-2"})
        assert_retryable_503(later, "not_admitting")

        redis.start()
        # Nothing of the refused creates remains (an uncertain one is retired once Redis answers).
        deadline = time.monotonic() + STEP
        while (records := await stored(stack)) or await reserved_cpu(stack, "n1"):
            assert time.monotonic() < deadline, records
            await asyncio.sleep(0.1)
        # Once the cluster is back, the same keys create for real (no stale key replays a retired record).
        deadline = time.monotonic() + 3 * STEP
        while (
            again := await http.post("/v1/environments", json=SPEC, headers={"Idempotency-Key": "k-1"})
        ).status_code == 503:
            assert time.monotonic() < deadline, again.text
            await asyncio.sleep(float(again.headers["retry-after"]) / 4)
        assert again.status_code == 201, again.text
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.get(again.json()["id"])
        await env.wait_until_running(30)
        assert env.state == "running"
    assert [r.state.value for r in await stored(stack)] == ["running"]


@pytest.mark.req("ENV-1", "NOD-6")
async def test_a_node_not_admitting_gets_a_retryable_503_never_a_failed_environment(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    agent = nc.nodes["n1"]
    await asyncio.sleep(0.6)  # a first capacity report has reached the Coordinator
    stop_reporting(agent)
    try:
        async with stack.http(key) as http:
            refused = await http.post("/v1/environments", json=SPEC, headers={"Idempotency-Key": "k-1"})
            assert_retryable_503(refused, "not_admitting")
            assert "n1" in refused.json()["error"]["message"]
            # Nothing committed: no record, no reservation, and the node runs nothing for it.
            assert await stored(stack) == []
            assert await reserved_cpu(stack, "n1") == 0
            assert not agent.controllers
    finally:
        resume_reporting(agent)
    # Admitting again: the SDK's create (same key) succeeds, honouring Retry-After while the node comes back.
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", idempotency_key="k-1", wait_timeout=30)
        assert env.state == "running" and env.node == "n1"
    assert [r.state.value for r in await stored(stack)] == ["running"]


@pytest.mark.req("ENV-1")
async def test_a_node_that_refuses_for_a_passing_reason_hands_the_create_to_the_next_node(
    node_cluster, api_for
) -> None:
    nc = await node_cluster(nodes=("n1", "n2"))
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    await asyncio.sleep(0.6)
    stop_reporting(nc.nodes["n1"])  # ranked first (same room, name order), but not admitting
    try:
        async with adx.AsyncClient(api_url=stack.url, api_key=key, retries=0) as client:
            env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
            assert env.state == "running" and env.node == "n2"
            # The Coordinator learned that n1 is not admitting: the next create goes straight to n2.
            second = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
            assert second.node == "n2"
        assert {r.state.value for r in await stored(stack)} == {"running"}
        assert await reserved_cpu(stack, "n1") == 0
        assert not nc.nodes["n1"].controllers
    finally:
        resume_reporting(nc.nodes["n1"])


@pytest.mark.req("ENV-1")
async def test_placement_skips_nodes_the_coordinator_knows_are_not_admitting(api_stack) -> None:
    """Closed admission and an expired session are passing states: 503 not_admitting with Retry-After; a node
    without room is no_capacity (503 with its own Retry-After); neither stores anything."""
    stack: ApiStack = await api_stack()
    key = await stack.tenant("alpha")
    node = await stack.register_node("n1")
    await node.stub.ReportCapacity(
        pb.ReportCapacityRequest(
            node="n1",
            session=node.session,
            capacity_json=json.dumps({"cpuMillis": 64_000, "memoryBytes": 2**38, "diskBytes": 2**40}),
            valid_for_seconds=600,
            admission_open=False,
        ),
        timeout=STEP,
    )
    async with stack.http(key) as http:
        closed = await http.post("/v1/environments", json=SPEC)
        assert_retryable_503(closed, "not_admitting")
        assert "n1: node admission closed" in closed.json()["error"]["message"]
        await stack.register_node("small", cpu_millis=100)
        mixed = await http.post("/v1/environments", json=SPEC)
        assert_retryable_503(mixed, "no_capacity")
        assert int(mixed.headers["retry-after"]) == 5
    assert await stored(stack) == []
