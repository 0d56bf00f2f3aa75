"""The proxies' plain ASGI answer (adx._proxy_answer) under a real uvicorn server, and through the whole data
plane: a streamed answer still streams, a client that hangs up mid-stream cancels the upstream, a short answer
arrives whole with its headers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from apistack import ApiStack
from starlette.types import Receive, Scope, Send

import adx
from adx._proxy_answer import ProxiedAnswer
from adx.node._relay import serve_asgi


class Upstream:
    """A stand-in upstream body: one chunk at once, another after ``gap`` s, or (``hang``) none ever."""

    def __init__(self, gap: float = 0.4, hang: bool = False) -> None:
        self.gap, self.hang = gap, hang
        self.closed = asyncio.Event()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            yield b'{"frame":1}\n'
            if self.hang:
                await asyncio.Event().wait()
            await asyncio.sleep(self.gap)
            yield b'{"frame":2}\n'
        finally:
            self.closed.set()  # what closes the upstream connection in the Relay and the Ingress


async def _serve(upstream: Upstream | None):  # type: ignore[no-untyped-def]
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if upstream is None:
            headers = [(b"content-length", b"11"), (b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")]
            answer = ProxiedAnswer(201, headers, whole=b'{"ok":true}')
        else:
            answer = ProxiedAnswer(200, [(b"content-type", b"application/x-ndjson")], chunks=upstream.chunks())
        await answer(scope, receive, send)

    return await serve_asgi(app, "127.0.0.1:0", None, "test-answer")


async def test_a_streamed_answer_sends_each_chunk_as_it_comes() -> None:
    upstream = Upstream(gap=0.6)
    server = await _serve(upstream)
    try:
        seen: list[tuple[float, bytes]] = []
        async with (
            httpx.AsyncClient() as client,
            client.stream("GET", f"http://127.0.0.1:{server.port}/") as answer,
        ):
            assert answer.headers.get("transfer-encoding") == "chunked"
            async for chunk in answer.aiter_raw():
                seen.append((time.monotonic(), chunk))
        assert b"".join(c for _, c in seen) == b'{"frame":1}\n{"frame":2}\n'
        assert seen[-1][0] - seen[0][0] >= 0.5, seen  # the first frame came before the second was produced
        assert upstream.closed.is_set()
    finally:
        await server.stop()


@pytest.mark.req("IDLE-2")
async def test_a_client_that_hangs_up_mid_stream_closes_the_upstream() -> None:
    """The disconnect detection the streaming keeps: the upstream body (the connection to the next hop) is
    closed when the caller goes away, though the upstream would never send again."""
    upstream = Upstream(hang=True)
    server = await _serve(upstream)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(reader.readline(), 5)  # the chunk's size line
        assert await asyncio.wait_for(reader.readline(), 5) == b'{"frame":1}\n'
        assert not upstream.closed.is_set()
        writer.close()
        await asyncio.wait_for(upstream.closed.wait(), 5)
    finally:
        await server.stop()


async def test_a_short_answer_arrives_whole_with_its_headers() -> None:
    server = await _serve(None)
    try:
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{server.port}/")
        assert answer.status_code == 201 and answer.content == b'{"ok":true}'
        assert answer.headers["content-length"] == "11" and "transfer-encoding" not in answer.headers
        assert answer.headers.get_list("set-cookie") == ["a=1", "b=2"]  # repeated headers kept
    finally:
        await server.stop()


def test_exactly_one_body_kind() -> None:
    with pytest.raises(ValueError, match="exactly one of chunks"):
        ProxiedAnswer(200, [])


@pytest.mark.req("IDLE-2")
async def test_hanging_up_on_a_command_through_ingress_and_relay_stops_it(node_cluster, api_for) -> None:
    """Through the real API (Ingress) and adxlet (Relay): the caller of a foreground command goes away mid-stream;
    both hops close their upstream, execd stops the command, and the Relay's open-stream count returns to 0."""
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    relay = nc.nodes["n1"].relay
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        # A short answer (execd's stat: a Content-Length) arrives whole, with its headers.
        await env.files.write("/tmp/short", b"x" * 10)
        async with stack.http(key) as http:
            stat = await http.get(f"/v1/environments/{env.id}/files/stat", params={"path": "/tmp/short"})
            assert stat.status_code == 200 and stat.json()["size"] == 10
            assert stat.headers["content-length"] == str(len(stat.content))
            assert stat.headers["content-type"].startswith("application/json")
            async with http.stream(
                "POST",
                f"/v1/environments/{env.id}/commands",
                json={"command": "echo $$ > /tmp/pid; echo started; sleep 60; touch /tmp/finished"},
            ) as running:
                async for line in running.aiter_lines():
                    if "started" in line:
                        break
                assert relay.streams.open.get(env.id) == 1
            # The context exit closed the connection mid-stream.
        deadline = time.monotonic() + 15
        while relay.streams.open.get(env.id):
            assert time.monotonic() < deadline, "the Relay kept the stream open after the caller left"
            await asyncio.sleep(0.05)
        pid = (await env.files.read("/tmp/pid")).decode().strip()
        while (await env.commands.run(f"kill -0 {pid} 2>/dev/null")).exit_code == 0:
            assert time.monotonic() < deadline, "the command still runs after its caller went away"
            await asyncio.sleep(0.1)
        await env.delete()
