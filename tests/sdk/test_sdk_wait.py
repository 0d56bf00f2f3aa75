"""The synchronous SDK's wait for running rides the server's ``?wait=running`` (the async twin: test_sdk.py):
real API server, Coordinator and Redis; the node's part is played through the node-facing RPCs."""

from __future__ import annotations

import asyncio

import pytest
from apistack import ApiStack

import adx


async def test_the_sync_client_waits_on_the_server_and_times_out_clearly(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    node = await stack.register_node("n1")
    await stack.following()
    cache = stack.cluster.coordinator.service.cache.environments

    async def node_starts_the_first() -> None:
        for _ in range(1000):  # bounded: ~10 s
            if cache:
                break
            await asyncio.sleep(0.01)
        (env_id,) = cache
        await asyncio.sleep(0.3)
        await stack.mark_running(node, env_id)

    def sync_part() -> tuple[str, str]:
        with adx.Client(api_url=stack.url, api_key=key) as client:
            env = client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=10)
            assert env.state == "running" and env.execution_id
            pending = client.environments.create(cpu=0.25, memory="256Mi", wait=False)
            with pytest.raises(adx.WaitTimeoutError) as caught:
                pending.wait_until_running(0.5)
            assert caught.value.code == "wait_timeout" and caught.value.environment is pending
            assert "still pending after 0.5s" in str(caught.value)
            return env.id, pending.id

    starter = asyncio.create_task(node_starts_the_first())
    running_id, pending_id = await asyncio.to_thread(sync_part)
    await starter
    assert cache[running_id].state == "running" and cache[pending_id].state == "pending"
