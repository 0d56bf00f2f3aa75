"""Ingress route caches follow the Coordinator's route publications (CRD-1)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import adx
from adx.api._coordinator import CoordinatorClient


async def eventually(predicate: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.req("CRD-1")
async def test_a_delete_through_another_replica_drops_the_cached_route_at_once(node_cluster, api_for) -> None:  # type: ignore[no-untyped-def]
    nc = await node_cluster()
    stack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    ingress = stack.server.config.app.state.plane.extras["ingress"]
    await eventually(lambda: ingress.following)
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        assert (await env.commands.run("true")).exit_code == 0
        cached = ingress._routes[("alpha", env.id)]
        # Followed routes live long: changes come by the stream, not by expiry.
        assert cached[1] - time.monotonic() > 60

        # Another API replica deletes it: this replica learns it from the Coordinator's publication.
        other = CoordinatorClient.from_config(stack.config)
        try:
            await other.delete_environment("alpha", env.id)
        finally:
            await other.close()
        await eventually(lambda: ("alpha", env.id) not in ingress._routes, within=2.0)
        with pytest.raises(adx.ConflictError):
            await env.commands.run("true")


@pytest.mark.req("CRD-1")
async def test_a_lost_route_stream_clears_the_cache_and_falls_back_to_short_ttls(node_cluster, api_for) -> None:  # type: ignore[no-untyped-def]
    nc = await node_cluster(redis_timeout=1.0)
    stack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    ingress = stack.server.config.app.state.plane.extras["ingress"]
    await eventually(lambda: ingress.following)
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        await env.commands.run("true")
        assert ("alpha", env.id) in ingress._routes
        # The Coordinator's Redis goes away: its route stream ends, the Ingress stops trusting its cache.
        nc.cluster.redis.send_signal(9)
        nc.cluster.redis.wait_exited()
        await eventually(lambda: not ingress.following and ("alpha", env.id) not in ingress._routes, within=10)
        nc.cluster.redis.start()
        await eventually(lambda: ingress.following, within=15)
