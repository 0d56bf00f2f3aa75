"""The agent worker's health endpoint (``serve_health``) on the shared bounded HTTP server: the same answers as
before (AGT-14: local state and counters only), one request per connection, and a probe-sized request cap."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest

from adx.agents._deploy import HEALTH_LIMITS, serve_health
from adx.agents._worker import AgentWorkerHealth

HEALTH = AgentWorkerHealth(
    state="running",
    identity="w-1",
    binding="tenant",
    tenant_id="t",
    ready=True,
    slots=2,
    busy_slots=1,
    ticks={"ran": 3},
    executed={"succeeded": 4},
    tick_timeouts=0,
    tick_errors=0,
    readiness_checks=5,
    readiness_failures=0,
    uptime_seconds=1.5,
)


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, list[AgentWorkerHealth]]]:
    current = [HEALTH]
    server = await serve_health(lambda: current[0], "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", current
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.req("AGT-14")
async def test_healthz_answers_the_workers_health(endpoint: tuple[str, list[AgentWorkerHealth]]) -> None:
    url, current = endpoint
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        ok = await client.get("/healthz")
        assert ok.status_code == 200 and ok.json() == dataclasses.asdict(HEALTH)
        assert ok.headers["connection"] == "close"
        current[0] = dataclasses.replace(HEALTH, ready=False)
        assert (await client.get("/healthz")).status_code == 503
        current[0] = dataclasses.replace(HEALTH, state="draining")
        assert (await client.get("/healthz")).status_code == 503
        for method, path in (("GET", "/other"), ("POST", "/healthz"), ("GET", "/healthz?x=1")):
            missing = await client.request(method, path)
            assert (missing.status_code, missing.json()) == (404, {"error": "not found"}), (method, path)


async def test_an_oversized_or_endless_probe_is_refused(endpoint: tuple[str, list[AgentWorkerHealth]]) -> None:
    url, _ = endpoint
    port = int(url.rsplit(":", 1)[1])

    async def send(request: bytes, then: bytes = b"") -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request)
            async with asyncio.timeout(HEALTH_LIMITS.head_seconds + 10):
                while then and not reader.at_eof():
                    writer.write(then)  # an endless header: the server answers and closes mid-way
                    try:
                        await writer.drain()
                    except ConnectionError:
                        break
                    await asyncio.sleep(0)
                    if len(reader._buffer):
                        break
                return await reader.read()
        finally:
            writer.close()

    many = b"".join(b"X-%d: 1\r\n" % i for i in range(HEALTH_LIMITS.header_count + 1))
    assert (await send(b"GET /healthz HTTP/1.1\r\nHost: h\r\n" + many + b"\r\n")).startswith(b"HTTP/1.1 431 ")
    endless = await send(b"GET /healthz HTTP/1.1\r\nHost: h\r\nX-Endless: ", then=b"v" * 4096)
    assert endless.startswith(b"HTTP/1.1 431 "), endless[:100]
    big = b"POST /healthz HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % (HEALTH_LIMITS.body_bytes + 1)
    assert (await send(big)).startswith(b"HTTP/1.1 413 ")
