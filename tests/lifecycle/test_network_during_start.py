"""NOD-10 against a race: a network policy stored while the node is still starting the sandbox."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import adx
from adx.model import EnvironmentRecord
from adx.sandboxd import SandboxdClient


async def wait_for(predicate: Callable[[], Awaitable[Any]], within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while not (value := await predicate()):
        assert time.monotonic() < deadline, f"timed out after {within}s waiting for {what}"
        await asyncio.sleep(0.2)
    return value


@pytest.mark.req("NOD-10")
async def test_a_policy_changed_while_the_environment_starts_is_applied_once_it_runs(node_cluster, api_for) -> None:
    """A policy stored while the node was still starting the sandbox: the node's Running commit meets the newer
    record (a conflict it adopts), so the sandbox runs the policy it started with and the record says the new
    one is not applied yet. The node must apply it in place then, not wait for some later change of the record.
    Seen as a policy switch that took ~30 s in the full suite (tests/e2b/test_e2b_network.py)."""
    nc = await node_cluster()
    agent = nc.nodes["n1"]
    stack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    starting = asyncio.Event()
    go_on = asyncio.Event()
    start = agent.driver.start

    async def held_start(spec: Any) -> Any:  # a slow sandbox start: the backend waits, nothing is faked
        starting.set()
        await go_on.wait()
        return await start(spec)

    agent.driver.start = held_start
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        create = asyncio.create_task(client.environments.create(cpu=0.25, memory="128Mi", network={"mode": "egress"}))
        await asyncio.wait_for(starting.wait(), 30)
        (listed,) = await client.environments.list()
        env = await client.environments.get(listed.id)
        await env.set_network(deny=["192.0.2.0/24"])
        go_on.set()
        env = await asyncio.wait_for(create, 60)
        assert env.state == "running"

        async def applied() -> bool:
            async with SandboxdClient(nc.sandboxds["n1"].socket) as sbx:
                (sandbox,) = await sbx.list()
            policy = sandbox.network_policy
            return policy is not None and policy.deny == ["192.0.2.0/24"]

        await wait_for(applied, 15, "the policy stored during the start to be applied in place")

        async def published() -> EnvironmentRecord | None:
            record = await nc.cluster.coordinator.store.get_environment(env.id)
            return record if record.network_applied_revision == record.network_revision > 0 else None

        record = await wait_for(published, 15, "the applied revision to be published")
        assert record.execution_id == env.execution_id  # applied in place: the same execution
        await env.delete()
