"""The first command after ``create(wait=True)`` finds its route in the Ingress's cache: the create's wait read it
when the start was published (real parts: SDK -> API + Ingress -> Coordinator (Redis) -> adxlet, sandboxd,
execd). ``Ingress.route_lookups`` counts the requests whose route was asked of the Coordinator."""

from __future__ import annotations

import asyncio
import time

import pytest
from apistack import ApiStack

import adx


@pytest.mark.req("CRD-1")
async def test_the_first_command_after_a_waited_create_does_not_ask_the_coordinator(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    ingress = await stack.following()
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        assert env.state == "running"
        before = ingress.route_lookups
        assert (await env.commands.run("echo first")).stdout == "first\n"
        assert ingress.route_lookups == before  # primed by the create's wait

        # The control: a create without the wait, then the SDK's old poll (plain GETs, which prime nothing):
        # the first command resolves its route at the Coordinator, once.
        other = await client.environments.create(cpu=0.25, memory="256Mi", wait=False)
        deadline = time.monotonic() + 30
        while (await other.refresh()).state != "running":
            assert time.monotonic() < deadline, "the second Environment did not start in time"
            await asyncio.sleep(0.02)
        before = ingress.route_lookups
        assert (await other.commands.run("true")).exit_code == 0
        assert (await other.commands.run("true")).exit_code == 0
        assert ingress.route_lookups == before + 1
        for made in (env, other):
            await made.delete()
