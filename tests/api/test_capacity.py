"""Capacity that bends (issue 16): CPU overcommit on a node, capacity refusals as a retryable 503 with
Retry-After, and a delete that releases its reservation before it returns (real Coordinator, Redis, adxlet,
sandboxd and API server)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from apistack import ApiStack

import adx

GiB = 2**30
HALF_CPU: dict[str, Any] = {"resources": {"cpuMillis": 500, "memoryBytes": 64 * 2**20}}


async def wait_admitting(stack: ApiStack, node: str) -> None:
    """Until the node's first capacity report reached the Coordinator (placement needs it)."""
    for _ in range(100):
        if (await stack.cluster.coordinator.store.get_node(node)).capacity.cpu_millis:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"node {node} never reported its capacity")


async def create(http: httpx.AsyncClient, spec: dict[str, Any]) -> httpx.Response:
    return await http.post("/v1/environments", json=spec)


def assert_capacity_503(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "no_capacity", error
    assert int(response.headers["retry-after"]) >= 1
    assert error["details"]["retry_after_seconds"] > 0


@pytest.mark.req("RES-4")
async def test_cpu_requests_may_exceed_capacity_by_the_node_overcommit_ratio(node_cluster, api_for) -> None:
    """A 2-CPU node with cpu_overcommit 4.0 takes 5 (and up to 16) Environments of 0.5 CPU; the 17th is refused
    with a retryable 503. Memory stays hard."""
    nc = await node_cluster(
        capacity={"cpuMillis": 2000, "memoryBytes": 4 * GiB},
        node_config={"cpu_overcommit": 4.0},
        # sandboxd, the node's local backstop, admits as far (this machine has 2 CPUs or more).
        sandboxd_config={"capacity": {"cpu_millis": 2000, "cpu_overcommit": 4.0}},
        metrics_listen=True,
    )
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    await wait_admitting(stack, "n1")
    async with stack.http(key) as http:
        made = [await create(http, HALF_CPU) for _ in range(5)]
        assert [r.status_code for r in made] == [201] * 5, [r.text for r in made]
        made += [await create(http, HALF_CPU) for _ in range(11)]
        assert [r.status_code for r in made] == [201] * 16, [r.text for r in made]
        for response in made:  # taken, and started: sandboxd admits them too
            await wait_running(http, response.json()["id"])
        assert_capacity_503(await create(http, HALF_CPU))
        # Memory is never overcommitted: 5 GiB on a 4 GiB node is refused whatever the CPU ratio.
        big = {"resources": {"cpuMillis": 100, "memoryBytes": 5 * GiB}}
        refused = await create(http, big)
        assert_capacity_503(refused)
        assert "memory" in refused.json()["error"]["message"]
    node = await stack.cluster.coordinator.store.get_node("n1")
    assert node.capacity.cpu_millis == 2000 and node.cpu_overcommit == 4.0
    assert node.cpu_limit_millis == 8000 and node.reserved.cpu_millis == 8000
    assert node.allocatable.cpu_millis == 0 and node.allocatable.memory_bytes == 4 * GiB - 16 * 64 * 2**20
    # The node's own metrics say the same: requested (reserved), capacity, limit and allocatable.
    async with httpx.AsyncClient() as plain:
        text = (await plain.get(f"http://127.0.0.1:{nc.nodes['n1'].metrics_port}/metrics")).text
    for line in (
        'adx_node_cpu_overcommit_ratio{node="n1"} 4.0',
        'adx_node_reserved_cpu_millis{node="n1"} 8000.0',
        'adx_node_capacity_cpu_millis{node="n1"} 2000.0',
        'adx_node_limit_cpu_millis{node="n1"} 8000.0',
        'adx_node_allocatable_cpu_millis{node="n1"} 0.0',
        'adx_node_limit_memory_bytes{node="n1"} 4.294967296e+09',
    ):
        assert line in text, (line, [x for x in text.splitlines() if x.startswith("adx_node_")])


@pytest.mark.req("RES-4")
async def test_without_overcommit_requests_stay_within_capacity(node_cluster, api_for) -> None:
    """The default ratio of a node (1.0): 4 of 0.5 CPU fit on 2 CPUs, the 5th is a retryable 503 (never 409)."""
    nc = await node_cluster(capacity={"cpuMillis": 2000, "memoryBytes": 4 * GiB})
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    await wait_admitting(stack, "n1")
    async with stack.http(key) as http:
        made = [await create(http, HALF_CPU) for _ in range(4)]
        assert [r.status_code for r in made] == [201] * 4, [r.text for r in made]
        assert_capacity_503(await create(http, HALF_CPU))


async def test_a_create_right_after_a_delete_is_never_refused_for_capacity(node_cluster, api_for) -> None:
    """The node is full; each delete's reply comes after the reservation is released, so the create that
    follows at once always finds room (issue 16: it was refused while the node still held the reservation)."""
    nc = await node_cluster(capacity={"cpuMillis": 1000, "memoryBytes": 4 * GiB})
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    await wait_admitting(stack, "n1")
    full = {"resources": {"cpuMillis": 1000, "memoryBytes": 64 * 2**20}}
    async with stack.http(key) as http:
        current = await create(http, full)
        assert current.status_code == 201, current.text
        for _ in range(5):
            env_id = current.json()["id"]
            await wait_running(http, env_id)
            deleted = await http.delete(f"/v1/environments/{env_id}")
            assert deleted.status_code == 200, deleted.text
            current = await create(http, full)
            assert current.status_code == 201, current.text
            # The reply says the release happened: the record is gone, not still deleting.
            assert deleted.json()["state"] == "deleted", deleted.json()
    assert (await stack.cluster.coordinator.store.get_node("n1")).reserved.cpu_millis == 1000


async def wait_running(http: httpx.AsyncClient, env_id: str) -> None:
    for _ in range(300):
        state = (await http.get(f"/v1/environments/{env_id}")).json()["state"]
        if state == "running":
            return
        assert state in ("pending", "starting"), state
        await asyncio.sleep(0.02)
    raise AssertionError(f"{env_id} never ran")


async def test_the_e2b_edge_answers_a_capacity_refusal_with_503_and_retry_after(node_cluster, api_for) -> None:
    """E2B's create on a full node, once its wait for capacity (e2b_capacity_wait_seconds) ran out: 503 in E2B's
    error shape with Retry-After, so a client knows when to ask again (it had no Retry-After)."""
    nc = await node_cluster(capacity={"cpuMillis": 1000, "memoryBytes": 4 * GiB})
    stack: ApiStack = await api_for(nc.cluster, e2b_capacity_wait_seconds=1.0)
    key = await stack.tenant("alpha")
    await wait_admitting(stack, "n1")
    async with stack.http(key) as http:
        filled = await create(http, {"resources": {"cpuMillis": 1000, "memoryBytes": 64 * 2**20}})
        assert filled.status_code == 201, filled.text
        started = time.monotonic()
        refused = await http.post("/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": key})
        waited = time.monotonic() - started
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == 503 and "no capacity" in refused.json()["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert 1.0 <= waited < 5, f"the create waited {waited:.1f} s for capacity (bound 1 s)"


async def test_an_e2b_create_waits_for_capacity_freed_meanwhile(node_cluster, api_for) -> None:
    """The E2B SDK does not retry a 503, so its create waits on the server's side: a create that finds the node
    full answers 201 once a delete made room, within e2b_capacity_wait_seconds (a burst of E2B creates on a full
    node failed a third of them before, bench_tti)."""
    nc = await node_cluster(capacity={"cpuMillis": 1000, "memoryBytes": 4 * GiB})
    stack: ApiStack = await api_for(nc.cluster)  # the default wait, 30 s
    key = await stack.tenant("alpha")
    await wait_admitting(stack, "n1")
    async with stack.http(key) as http:
        filled = await create(http, {"resources": {"cpuMillis": 1000, "memoryBytes": 64 * 2**20}})
        assert filled.status_code == 201, filled.text
        waiting = asyncio.create_task(
            http.post("/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": key}, timeout=60)
        )
        await asyncio.sleep(1.5)
        assert not waiting.done(), "the create was answered while the node was full"
        deleted = await http.delete(f"/v1/environments/{filled.json()['id']}")
        assert deleted.status_code in (200, 202, 204), deleted.text
        created = await waiting
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["sandboxID"]
        assert (await http.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-Key": key})).status_code == 204


async def test_the_sdk_create_waits_for_capacity_when_asked(node_cluster, api_for) -> None:
    """create(wait=SECONDS) sends a create refused for capacity again after Retry-After until room appears (a
    delete meanwhile); a wait that runs out raises NoCapacityError saying so; wait=True refuses at once."""
    nc = await node_cluster(capacity={"cpuMillis": 1000, "memoryBytes": 4 * GiB})
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    await wait_admitting(stack, "n1")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        first = await client.environments.create(cpu=1, memory="64Mi", wait_timeout=30)
        started = time.monotonic()
        with pytest.raises(adx.errors.NoCapacityError) as at_once:
            await client.environments.create(cpu=1, memory="64Mi")
        assert time.monotonic() - started < 2 and "within wait" not in at_once.value.message
        # The sync twin, in a thread (this loop hosts the Coordinator): the wait runs out, nothing was created.
        with adx.Client(api_url=stack.url, api_key=key) as sync:
            started = time.monotonic()
            with pytest.raises(adx.errors.NoCapacityError, match=r"within wait=0.5s \(nothing was created\)"):
                await asyncio.to_thread(sync.environments.create, cpu=1, memory="64Mi", wait=0.5)
            assert 0.5 <= time.monotonic() - started < 3
            with pytest.raises(adx.errors.InvalidInputError) as bad:
                sync.environments.create(cpu=1, memory="64Mi", wait=-1)
            assert bad.value.field == "wait"

        async def free_soon() -> None:
            await asyncio.sleep(1.0)
            await first.delete()

        freeing = asyncio.create_task(free_soon())
        started = time.monotonic()
        second = await client.environments.create(cpu=1, memory="64Mi", wait=30, wait_timeout=30)
        await freeing
        assert second.state == "running" and 1.0 <= time.monotonic() - started < 30
    assert (
        len([r for r in await stack.cluster.coordinator.store.load_all_environments() if r.state.value != "deleted"])
        == 1
    )
