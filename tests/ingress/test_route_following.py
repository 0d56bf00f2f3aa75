"""Ingress route caches follow the Coordinator's route publications (CRD-1)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

import adx
from adx.gateway._coordinator import CoordinatorClient


async def eventually(predicate: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.req("CRD-1")
async def test_a_delete_through_another_replica_drops_the_cached_route_at_once(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    ingress = stack.server.config.app.state.ingress
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


@pytest.mark.req("JRN-4", "CRD-1", "ENV-6")
async def test_cached_routes_keep_serving_through_an_outage_and_pause_still_reaches_the_node(
    node_cluster, api_for
) -> None:
    nc = await node_cluster(redis_timeout=1.0)
    stack = await api_for(nc.cluster, auth_cache_seconds=120)
    key = await stack.tenant("alpha")
    ingress = stack.server.config.app.state.ingress
    await eventually(lambda: ingress.following)
    async with adx.AsyncClient(api_url=stack.url, api_key=key, retries=0) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        await env.commands.run("true")
        assert ("alpha", env.id) in ingress._routes
        # The Coordinator's Redis goes away: its route stream ends, but the cached route keeps serving.
        nc.cluster.redis.send_signal(9)
        nc.cluster.redis.wait_exited()
        await eventually(lambda: not ingress.following, within=10)
        assert ("alpha", env.id) in ingress._routes
        for _ in range(3):
            assert (await env.commands.run("echo still")).stdout == "still\n"
        # CRD-1: the pause goes straight to the owning node from the cached route; the node does it and keeps
        # the result until the cluster can store it (it answers publication pending, never "no Coordinator").
        async with stack.http(key) as http:
            paused = await http.post(f"/v1/environments/{env.id}/pause")
        assert paused.status_code == 503, paused.text
        assert "publication" in paused.json()["error"]["code"] + paused.json()["error"]["message"], paused.text
        # ENV-6/JRN-4: while the Coordinator cannot answer, GET is the owning node's view, flagged as such.
        async with stack.http(key) as http:
            got = await http.get(f"/v1/environments/{env.id}")
        assert got.status_code == 200, got.text
        # (no journal here: the node's pause waits in memory for its first commit, so it still runs.)
        assert got.json()["publicationPending"] is True and got.json()["state"] in ("running", "paused"), got.text
        assert got.headers["x-adx-answered-by"] == "node"
        seen = await client.environments.get(env.id)
        assert seen.publication_pending
        nc.cluster.redis.start()
        await eventually(lambda: ingress.following, within=20)
        deadline = time.monotonic() + 30
        while (published := await client.environments.get(env.id)).state != "paused" or published.publication_pending:
            assert time.monotonic() < deadline, "the journaled pause was not published"
            await asyncio.sleep(0.2)
        # The resync reconciled the cache: the paused Environment's route is gone.
        await eventually(lambda: ("alpha", env.id) not in ingress._routes, within=5)


@pytest.mark.req("JRN-4", "CRD-1")
async def test_a_resync_reconciles_the_cache_instead_of_dropping_it(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    ingress = stack.server.config.app.state.ingress
    await eventually(lambda: ingress.following)
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        kept = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        gone = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        for env in (kept, gone):
            await env.commands.run("true")
        # The stream is down while another replica deletes one of them: this replica misses the event.
        ingress._follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ingress._follower
        ingress._follower, ingress.following = None, False
        other = CoordinatorClient.from_config(stack.config)
        try:
            await other.delete_environment("alpha", gone.id)
        finally:
            await other.close()
        await asyncio.sleep(0.3)
        assert ("alpha", gone.id) in ingress._routes  # missed
        ingress.start_following()
        await eventually(lambda: ingress.following and ("alpha", gone.id) not in ingress._routes, within=5)
        assert ("alpha", kept.id) in ingress._routes  # still there: kept, not dropped
        assert (await kept.commands.run("echo ok")).stdout == "ok\n"
