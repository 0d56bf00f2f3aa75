"""The SDK's retries follow the server's Retry-After (issue 12: a create refused as retryable during a short
outage is sent again when the cluster said, not on the SDK's own faster backoff). Real stack: SDK -> API
server -> Coordinator (Redis) -> adxlet -> sandboxd."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from apistack import ApiStack

import adx
from adx.sdk._client import MAX_RETRY_AFTER, backoff, retry_delay


def test_retry_delay_reads_seconds_caps_them_and_falls_back_on_anything_else() -> None:
    def refused(value: str | None) -> httpx.Response:
        return httpx.Response(503, headers={} if value is None else {"Retry-After": value})

    assert retry_delay(0, refused("2")) == 2.0
    assert retry_delay(0, refused("0")) == 0.0
    assert retry_delay(1, refused("3600")) == MAX_RETRY_AFTER
    assert retry_delay(2, refused("Wed, 21 Oct 2026 07:28:00 GMT")) == backoff(2)
    assert retry_delay(2, refused("-1")) == backoff(2)
    assert retry_delay(1, refused(None)) == backoff(1)
    assert retry_delay(3, None) == backoff(3)


@pytest.mark.req("ENV-5")
async def test_a_create_no_node_admits_for_a_moment_is_retried_after_the_servers_retry_after(
    node_cluster, api_for
) -> None:  # type: ignore[no-untyped-def]
    """The only node stops admitting (as under pressure), a create is refused 503 with Retry-After: 2; the
    node admits again 1.5 s later. The SDK's own backoff would have spent its 3 retries within 1.4 s and
    failed; following Retry-After, its second attempt lands and the create succeeds."""
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    agent = nc.nodes["n1"]
    coordinator = nc.cluster.coordinator.service
    agent.reporter.tracker.pressure_closed = True
    deadline = time.monotonic() + 10
    while coordinator.cache.nodes["n1"].admission_open:
        assert time.monotonic() < deadline, "the Coordinator never saw the node close its admission"
        await asyncio.sleep(0.05)

    async def reopen() -> None:
        await asyncio.sleep(1.5)
        agent.reporter.tracker.pressure_closed = False

    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        started = time.monotonic()
        reopening = asyncio.create_task(reopen())
        env = await client.environments.create(cpu=0.25, memory="256Mi")
        took = time.monotonic() - started
        await reopening
        assert env.state == "running"
        assert took >= 2.0, took  # it waited for the server's Retry-After at least once
        await env.delete()
