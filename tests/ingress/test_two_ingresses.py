"""Several API servers / Ingresses in front of one cluster (CRD-5): one resume intent, one new execution."""

from __future__ import annotations

import asyncio
import time

import pytest
from apistack import ApiStack

import adx


@pytest.mark.req("CRD-5", "ENV-4")
async def test_a_paused_environment_woken_on_two_ingresses_at_once_resumes_once(node_cluster, api_for) -> None:
    nc = await node_cluster()
    first: ApiStack = await api_for(nc.cluster)
    second: ApiStack = await api_for(nc.cluster)  # a second, independent API server + Ingress (own HTTP server)
    key = await first.tenant("alpha")
    async with (
        adx.AsyncClient(api_url=first.url, api_key=key) as a,
        adx.AsyncClient(api_url=second.url, api_key=key) as b,
    ):
        env = await a.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        await env.files.write("/work/kept.txt", b"kept")
        before = env.execution_id
        await env.pause()
        assert (await a.environments.get(env.id)).state == "paused"
        on_b = await b.environments.get(env.id)
        # Both Ingresses meet the paused Environment at the same moment: each wakes it (EnsureRunning).
        results = await asyncio.gather(env.commands.run("cat /work/kept.txt"), on_b.commands.run("cat /work/kept.txt"))
        assert [r.stdout for r in results] == ["kept", "kept"]
        after = await a.environments.get(env.id)
        assert after.state == "running" and after.execution_id not in (None, before)
        # One new execution: the node runs exactly one sandbox for it, the resumed one.
        deadline = time.monotonic() + 10
        while True:
            sandboxes = {s.sandbox_id for s in await nc.nodes["n1"].driver.client.list()}
            if sandboxes == {after.execution_id} or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert sandboxes == {after.execution_id}
        assert (await b.environments.get(env.id)).execution_id == after.execution_id
