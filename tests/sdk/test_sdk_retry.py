"""The SDK's retries follow the server's Retry-After (issue 12: a create refused as retryable during a short
outage is sent again when the cluster said, not on the SDK's own faster backoff). Real stack: SDK -> API
server -> Coordinator (Redis) -> adxlet -> sandboxd."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from apistack import ApiStack

import adx
from adx.sdk._calls import Call, Sleep, request
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
    node_cluster, api_for, tmp_path: Path
) -> None:
    """The only node stops admitting under memory pressure (RES-7, read from the meminfo file it is configured
    with), a create is refused 503 with Retry-After: 2; the pressure ends 1.5 s later and the node admits again
    at its next report. The SDK's own backoff would have spent its 3 retries within 1.4 s and failed;
    following Retry-After, a later attempt lands and the create succeeds."""
    meminfo = tmp_path / "meminfo"

    def memory_in_use(percent: int) -> None:
        total = 16_000_000
        available = total * (100 - percent) // 100
        meminfo.write_text(f"MemTotal: {total} kB\nMemAvailable: {available} kB\n")

    memory_in_use(10)
    pressure = {"memory_high": 0.9, "memory_low": 0.8, "disk_high": 1.0, "disk_low": 0.99, "meminfo_path": meminfo}
    nc = await node_cluster(node_config={"pressure": pressure})
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    coordinator = nc.cluster.coordinator.service
    memory_in_use(97)
    deadline = time.monotonic() + 10
    while coordinator.cache.nodes["n1"].admission_open:
        assert time.monotonic() < deadline, "the Coordinator never saw the node close its admission"
        await asyncio.sleep(0.05)

    async def reopen() -> None:
        await asyncio.sleep(1.5)
        memory_in_use(10)

    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        started = time.monotonic()
        reopening = asyncio.create_task(reopen())
        env = await client.environments.create(cpu=0.25, memory="256Mi")
        took = time.monotonic() - started
        await reopening
        assert env.state == "running"
        assert took >= 2.0, took  # it waited for the server's Retry-After at least once
        await env.delete()


def test_the_retry_rules_are_one_plan_both_clients_carry_out() -> None:
    """``adx.sdk._calls.request`` decides every resend for Client and AsyncClient alike: driven here step by step
    with real httpx answers and errors (no server: the plan does no I/O itself)."""
    url = "http://127.0.0.1:9"

    def answer(status: int, **headers: str) -> httpx.Response:
        return httpx.Response(status, headers=headers, request=httpx.Request("GET", url))

    with adx.Client(api_url=url, api_key="k", retries=2) as client:
        listing = Call("GET", "/v1/environments", what="list environments", idempotent=True)
        plan = request(client, listing)
        assert next(plan) is listing
        assert plan.send(answer(503, **{"Retry-After": "2"})) == Sleep(2.0)  # the server said when
        assert plan.send(None) is listing
        refused = httpx.ConnectError("refused", request=httpx.Request("GET", url))
        assert plan.throw(refused) == Sleep(backoff(1))  # never sent: the client's own backoff
        assert plan.send(None) is listing
        with pytest.raises(adx.errors.UnavailableError):
            plan.send(answer(503))  # the last attempt's refusal is the caller's
        ok = answer(200)
        plan = request(client, listing)
        next(plan)
        with pytest.raises(StopIteration) as done:
            plan.send(ok)
        assert done.value.value is ok

        creating = Call("POST", "/v1/environments/e/tokens", what="create a token", idempotent=False)
        plan = request(client, creating)
        next(plan)
        lost = httpx.ReadTimeout("no answer", request=httpx.Request("POST", url))
        with pytest.raises(adx.errors.UncertainOutcomeError):
            plan.throw(lost)  # it may have reached the server: a non-idempotent call is not sent again
