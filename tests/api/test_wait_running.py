"""``?wait=running`` on create and on GET: the API answers when the node's commit is published on the route stream
(real Coordinator, real Redis, the real API server; the node's part is played through the node-facing RPCs)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from apistack import ApiStack, NodeHandle

SPEC: dict[str, Any] = {"resources": {"cpuMillis": 250, "memoryBytes": 2**28}}


async def start_later(stack: ApiStack, node: NodeHandle, env_id: str, after: float = 0.3) -> None:
    await asyncio.sleep(after)
    await stack.mark_running(node, env_id)


@pytest.mark.req("CRD-1")
async def test_get_with_wait_answers_once_the_start_is_committed(api_stack, monkeypatch) -> None:
    # Only the route stream can wake it: the Coordinator is not asked again on a timer within this test's
    # HTTP timeout (10 s), and the wait asked for is longer than that.
    monkeypatch.setattr("adx.gateway._wait.CHECK_EVERY_SECONDS", 60.0)
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    node = await stack.register_node("n1")
    await stack.following()
    async with stack.http(key) as http:
        env = (await http.post("/v1/environments", json=SPEC)).json()
        assert env["state"] == "pending"
        starter = asyncio.create_task(start_later(stack, node, env["id"]))
        got = await http.get(f"/v1/environments/{env['id']}", params={"wait": "running", "waitSeconds": 30})
        await starter
        assert got.status_code == 200, got.text
        assert got.json()["state"] == "running" and got.json()["executionId"]  # answered after the commit
        # Running already: the wait answers at once.
        again = await http.get(f"/v1/environments/{env['id']}", params={"wait": "running"})
        assert again.status_code == 200 and again.json()["state"] == "running"
        # waitSeconds alone is the same wait (schemathesis: a schema-valid request must not be refused).
        alone = await http.get(f"/v1/environments/{env['id']}", params={"waitSeconds": 5})
        assert alone.status_code == 200 and alone.json()["state"] == "running"


async def test_wait_seconds_alone_waits_for_running(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    node = await stack.register_node("n1")
    await stack.following()
    async with stack.http(key) as http:
        env = (await http.post("/v1/environments", json=SPEC)).json()
        starter = asyncio.create_task(start_later(stack, node, env["id"]))
        got = await http.get(f"/v1/environments/{env['id']}", params={"waitSeconds": 8})
        await starter
        assert got.status_code == 200, got.text
        assert got.json()["state"] == "running"


@pytest.mark.req("CRD-1")
async def test_create_with_wait_answers_running_and_primes_the_route_cache(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    node = await stack.register_node("n1", relay_address="127.0.0.1:7")
    ingress = await stack.following()

    async def node_starts_it() -> None:
        cache = stack.cluster.coordinator.service.cache.environments
        for _ in range(1000):  # bounded: ~10 s
            if cache:
                break
            await asyncio.sleep(0.01)
        (env_id,) = cache
        await start_later(stack, node, env_id)

    starter = asyncio.create_task(node_starts_it())
    async with stack.http(key) as http:
        created = await http.post("/v1/environments", json=SPEC, params={"wait": "running", "waitSeconds": 8})
    await starter
    assert created.status_code == 201, created.text
    env = created.json()
    assert env["state"] == "running" and env["executionId"]
    # The wait read the route once the start was published and left it in the Ingress's cache: the first
    # command finds the Relay there instead of asking the Coordinator.
    tenant = stack.cluster.coordinator.service.cache.environments[env["id"]].tenant
    route = ingress.cached_route(tenant, env["id"])
    assert route is not None and route.relay_address == "127.0.0.1:7" and route.record.state == "running"


async def test_a_wait_that_ends_first_is_a_clear_503_on_get_and_the_pending_environment_on_create(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    async with stack.http(key) as http:
        created = await http.post("/v1/environments", json=SPEC, params={"wait": "running", "waitSeconds": 0.3})
        assert created.status_code == 201, created.text
        env = created.json()
        assert env["state"] == "pending"  # created; the wait ended first and says where it is

        got = await http.get(f"/v1/environments/{env['id']}", params={"wait": "running", "waitSeconds": 0.3})
        assert got.status_code == 503, got.text
        error = got.json()["error"]
        assert error["code"] == "wait_timeout"
        assert env["id"] in error["message"] and "still pending" in error["message"]
        assert error["details"]["id"] == env["id"] and error["details"]["state"] == "pending"
        assert error["details"]["waitedSeconds"] == 0.3
        assert got.headers["retry-after"] == "1"


async def test_a_wait_ends_at_once_on_a_state_that_will_not_run(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    node = await stack.register_node("n1")
    await stack.following()
    async with stack.http(key) as http:
        env = (await http.post("/v1/environments", json=SPEC)).json()

        async def fail_it() -> None:
            await asyncio.sleep(0.3)
            await stack.commit(node, env["id"], {"state": "failed", "lastError": "image missing"})

        failer = asyncio.create_task(fail_it())
        got = await http.get(f"/v1/environments/{env['id']}", params={"wait": "running", "waitSeconds": 8})
        await failer
        assert got.status_code == 200 and got.json()["state"] == "failed"
        assert got.json()["lastError"] == "image missing"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"wait": "stopped"}, "wait"),
        ({"wait": "running", "waitSeconds": 0}, "waitSeconds"),
        ({"wait": "running", "waitSeconds": 301}, "waitSeconds"),
        ({"wait": "running", "waitSeconds": "soon"}, "waitSeconds"),
    ],
)
async def test_bad_wait_parameters_are_422_naming_the_parameter(api_stack, params, field) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    async with stack.http(key) as http:
        env = (await http.post("/v1/environments", json=SPEC)).json()
        got = await http.get(f"/v1/environments/{env['id']}", params=params)
        assert got.status_code == 422, got.text
        assert got.json()["error"]["details"]["field"] == field
        before = len(await stack.cluster.coordinator.store.load_all_environments())
        created = await http.post("/v1/environments", json=SPEC, params=params)
        assert created.status_code == 422 and created.json()["error"]["details"]["field"] == field
        assert len(await stack.cluster.coordinator.store.load_all_environments()) == before  # nothing created


async def test_a_create_whose_wait_loses_the_coordinator_still_answers_the_created_environment(api_stack) -> None:
    """A 503 after the create was stored would read "nothing was created": the answer is the 201 as without wait."""
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    await stack.following()
    cache = stack.cluster.coordinator.service.cache.environments
    async with stack.http(key) as http:
        creating = asyncio.create_task(
            http.post("/v1/environments", json=SPEC, params={"wait": "running", "waitSeconds": 8})
        )
        for _ in range(1000):  # bounded: ~10 s
            if cache:
                break
            await asyncio.sleep(0.01)
        (env_id,) = cache
        await stack.cluster.coordinator.stop(grace=None)
        created = await creating
    assert created.status_code == 201, created.text
    assert created.json()["id"] == env_id and created.json()["state"] == "pending"
