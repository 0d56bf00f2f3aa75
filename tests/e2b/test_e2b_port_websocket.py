"""WebSocket (HTTP/1.1 Upgrade) to a sandbox's port through ``get_host(port)`` and through the native
``/v1/environments/{id}/ports/{port}/...`` route, end to end against ``adx up``: client (httpx-ws) -> API and
Ingress -> the node's Relay (mutual TLS) -> a stdlib WebSocket echo server in a real sandbox (ws_echo_server.py).

Also the paths of port traffic: what the client sent (``%2F``, ``%25``, the query) is what the service sees,
for plain HTTP as for WebSocket (issue 14).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
import pytest
from e2b import AsyncSandbox
from httpx_ws import WebSocketDisconnect, WebSocketUpgradeError, aconnect_ws

import adx

if TYPE_CHECKING:
    from conftest import Up

pytestmark = pytest.mark.slow

PORT = 8765
SERVER = (Path(__file__).parent / "ws_echo_server.py").read_text()
LOG = "/tmp/ws_echo.log"
RAW = "/a%2Fb/%25x?q=%2F%25&r=1"  # decoded even once, the service would see another path


async def _start_server(sandbox: AsyncSandbox) -> None:
    await sandbox.files.write("/tmp/ws_echo_server.py", SERVER)
    await sandbox.commands.run(f"python3 /tmp/ws_echo_server.py {PORT} {LOG}", background=True)


@pytest.fixture
async def sandbox(adx_up: Up) -> AsyncIterator[AsyncSandbox]:
    made = await AsyncSandbox.create(**adx_up.opts())
    await _start_server(made)
    yield made
    await made.kill()


def _via_host(adx_up: Up, sandbox: AsyncSandbox, path: str) -> tuple[str, dict[str, str]]:
    """``get_host(PORT)`` sent to the API's address with the host name as ``Host`` (as a resolver mapping
    ``*.localhost`` to the loopback, or a TLS proxy in front of ADX, delivers it)."""
    host = sandbox.get_host(PORT)
    assert host.startswith(f"{PORT}-{sandbox.sandbox_id}."), host
    return f"ws://{urlsplit(adx_up.url).netloc}{path}", {"Host": host}


def _native(adx_up: Up, sandbox: AsyncSandbox, path: str) -> tuple[str, dict[str, str]]:
    base = adx_up.url.replace("http://", "ws://", 1)
    return f"{base}/v1/environments/{sandbox.sandbox_id}/ports/{PORT}{path}", {"Authorization": f"Bearer {adx_up.key}"}


async def _until_served(url: str, headers: dict[str, str], within: float = 30) -> None:
    """Wait until the server started in the background takes a WebSocket (the Relay answers 502 before)."""
    deadline = time.monotonic() + within
    while True:
        try:
            async with aconnect_ws(url, headers=headers) as ws:
                await ws.send_text("ready?")
                assert await ws.receive_text(timeout=10) == "ready?"
                return
        except WebSocketUpgradeError as exc:
            assert exc.response.status_code == 502 and time.monotonic() < deadline, exc.response.text
            await asyncio.sleep(0.2)


async def _echoes(url: str, headers: dict[str, str]) -> None:
    """Text, binary and a 1 MiB message both ways; the raw path and query reach the service unchanged; the
    subprotocol and the service's own 101 headers come back; the client's close reaches the service."""
    big = os.urandom(1 << 20)
    async with (
        httpx.AsyncClient(timeout=60) as client,
        aconnect_ws(url, client, headers=headers, subprotocols=["v1.echo"], max_message_size_bytes=4 << 20) as ws,
    ):
        assert ws.subprotocol == "v1.echo"
        assert ws.response is not None and ws.response.headers.get("x-echo") == "yes"
        await ws.send_text("héllo")
        assert await ws.receive_text(timeout=30) == "héllo"
        await ws.send_bytes(b"\x00\x01\xff")
        assert await ws.receive_bytes(timeout=30) == b"\x00\x01\xff"
        await ws.send_bytes(big)
        assert await ws.receive_bytes(timeout=60) == big
        await ws.send_text("x" * (1 << 20))
        assert await ws.receive_text(timeout=60) == "x" * (1 << 20)
        await ws.send_text("path?")
        assert await ws.receive_text(timeout=30) == RAW
        await ws.close(4000, "client done")


async def _closed_codes(sandbox: AsyncSandbox) -> list[str]:
    try:
        return (await sandbox.files.read(LOG)).splitlines()
    except Exception:
        return []


async def _wait_logged(sandbox: AsyncSandbox, line: str) -> None:
    deadline = time.monotonic() + 20
    while line not in await _closed_codes(sandbox):
        assert time.monotonic() < deadline, (line, await _closed_codes(sandbox))
        await asyncio.sleep(0.2)


async def _server_closes(url: str, headers: dict[str, str]) -> None:
    """The service closes: the client gets its code and reason."""
    async with aconnect_ws(url, headers=headers) as ws:
        await ws.send_text("close-me")
        with pytest.raises(WebSocketDisconnect) as closed:
            await ws.receive_text(timeout=30)
        assert (closed.value.code, closed.value.reason) == (4001, "bye")


async def test_websocket_through_get_host(adx_up: Up, sandbox: AsyncSandbox) -> None:
    url, headers = _via_host(adx_up, sandbox, RAW)
    await _until_served(url, headers)
    await _echoes(url, headers)
    await _wait_logged(sandbox, f"{RAW} 4000")  # the client's close code reached the service
    await _server_closes(*_via_host(adx_up, sandbox, "/bye"))

    # The service's refusal is the client's answer, status, headers and body as they came.
    deny_url, deny_headers = _via_host(adx_up, sandbox, "/deny")
    with pytest.raises(WebSocketUpgradeError) as refused:
        async with aconnect_ws(deny_url, headers=deny_headers):
            pass
    answer = refused.value.response
    assert (answer.status_code, answer.headers.get("x-why")) == (403, "test"), answer.headers

    # A forged host name (no proof) reaches nothing.
    forged = {"Host": headers["Host"].replace(f"{sandbox.sandbox_id}.", f"{sandbox.sandbox_id}.aaaa", 1)}
    with pytest.raises(WebSocketUpgradeError) as missing:
        async with aconnect_ws(url, headers=forged):
            pass
    assert missing.value.response.status_code == 404


@pytest.mark.req("SEC-4")
async def test_websocket_through_the_native_port_route(adx_up: Up, sandbox: AsyncSandbox) -> None:
    url, headers = _native(adx_up, sandbox, RAW)
    await _until_served(url, headers)
    await _echoes(url, headers)
    await _wait_logged(sandbox, f"{RAW} 4000")
    await _server_closes(*_native(adx_up, sandbox, "/bye"))

    # The same checks as the HTTP port route, before anything is looked up: no key, another tenant's key, an
    # endpoint token of another port.
    async with adx.AsyncClient(api_url=adx_up.url, api_key=adx_up.key) as client:
        env = await client.environments.get(sandbox.sandbox_id)
        this_port, other_port = await env.tokens.create(port=PORT), await env.tokens.create(port=PORT + 1)
    refusals = [
        ({}, 401),
        ({"Authorization": f"Bearer {adx_up.other_key}"}, 404),
        ({"Authorization": f"Bearer {other_port.token}"}, 403),
    ]
    for denied, status in refusals:
        with pytest.raises(WebSocketUpgradeError) as refused:
            async with aconnect_ws(url, headers=denied):
                pass
        assert refused.value.response.status_code == status, refused.value.response.text

    # A token of this port in the query (a browser's way: no headers on a WebSocket) is taken out on the way.
    with_token = url.split("?")[0] + f"?x=1&adx_token={this_port.token}"
    async with aconnect_ws(with_token) as ws:
        await ws.send_text("path?")
        assert await ws.receive_text(timeout=30) == "/a%2Fb/%25x?x=1"


async def test_a_message_over_the_limit_closes_with_1009(adx_up: Up, sandbox: AsyncSandbox) -> None:
    """The service sends more than MAX_MESSAGE_BYTES (16 MiB) in one message: not buffered beyond the limit, the
    WebSocket is closed with 1009 (message too big) on both sides."""
    url, headers = _native(adx_up, sandbox, "/big")
    await _until_served(url, dict(headers))
    async with aconnect_ws(url, headers=headers, max_message_size_bytes=32 << 20) as ws:
        await ws.send_text(f"big:{(16 << 20) + 1}")
        with pytest.raises(WebSocketDisconnect) as closed:
            await ws.receive_bytes(timeout=60)
        assert closed.value.code == 1009, closed.value
    await _wait_logged(sandbox, "/big 1009")


async def test_http_port_paths_reach_the_service_unchanged(adx_up: Up, sandbox: AsyncSandbox) -> None:
    """Issue 14: ``%2F`` and ``%25`` in a port path were decoded on the way (the service saw ``/a/b//x``)."""
    api = urlsplit(adx_up.url).netloc
    await _until_served(*_via_host(adx_up, sandbox, RAW))
    async with httpx.AsyncClient(timeout=30) as client:
        native = await client.get(
            f"http://{api}/v1/environments/{sandbox.sandbox_id}/ports/{PORT}{RAW}",
            headers={"Authorization": f"Bearer {adx_up.key}"},
        )
        # (httpx-ws adds its upgrade headers to the dict it is given: a fresh one for plain HTTP)
        hosted = await client.get(f"http://{api}{RAW}", headers={"Host": sandbox.get_host(PORT)})
    # Before the fix: native saw '/a/b/%x?q=%2F%25&r=1'.
    assert [(native.status_code, native.text), (hosted.status_code, hosted.text)] == [(200, RAW)] * 2


@pytest.mark.req("ENV-4")
async def test_a_websocket_upgrade_wakes_a_paused_sandbox(adx_up: Up, sandbox: AsyncSandbox) -> None:
    url, headers = _via_host(adx_up, sandbox, "/after-pause")
    await _until_served(url, headers)
    await sandbox.pause()
    assert not await sandbox.is_running()
    # The upgrade wakes it; the sandbox restarts its entrypoint only, so nothing listens on the port yet: the
    # Relay's refusal (502) is the answer, and the sandbox runs again.
    with pytest.raises(WebSocketUpgradeError) as refused:
        async with httpx.AsyncClient(timeout=120) as client, aconnect_ws(url, client, headers=headers):
            pass
    assert refused.value.response.status_code == 502, refused.value.response.text
    assert await sandbox.is_running()
    await _start_server(sandbox)
    await _until_served(url, headers)


@pytest.mark.req("IDLE-2")
async def test_an_open_websocket_keeps_the_environment_from_idling(adx_up: Up) -> None:
    """An open WebSocket is an open Relay stream: a silent one for longer than the idle window keeps the
    Environment running; once it is closed the idle pause comes."""
    async with adx.AsyncClient(api_url=adx_up.url, api_key=adx_up.key) as client:
        env = await client.environments.create(
            cpu=0.25,
            memory="128Mi",
            idle_timeout=3,
            idle_action="pause",
            entrypoint=["python3", "-c", SERVER, str(PORT), LOG],
            wait_timeout=60,
        )
        try:
            base = adx_up.url.replace("http://", "ws://", 1)
            url = f"{base}/v1/environments/{env.id}/ports/{PORT}/idle"
            headers = {"Authorization": f"Bearer {adx_up.key}"}
            await _until_served(url, dict(headers))
            async with aconnect_ws(url, headers=dict(headers)) as ws:
                await ws.send_text("before")
                assert await ws.receive_text(timeout=30) == "before"
                await asyncio.sleep(8)  # silent: more than twice the idle window
                assert (await client.environments.get(env.id)).state == "running"
                await ws.send_text("after")
                assert await ws.receive_text(timeout=30) == "after"
            deadline = time.monotonic() + 60
            while (await client.environments.get(env.id)).state != "paused":
                assert time.monotonic() < deadline, "not paused after the WebSocket closed"
                await asyncio.sleep(0.5)
        finally:
            await env.delete()


async def test_a_slow_service_holds_the_sender_back(adx_up: Up, sandbox: AsyncSandbox) -> None:
    """Bounded buffers: while the service reads nothing, the client's sends stop after what the sockets and one
    message per hop hold (23 MiB when written: the kernel buffers of three connections, the proxies' message in
    hand), instead of everything being taken into the proxies' memory."""
    url, headers = _native(adx_up, sandbox, "/slow")
    await _until_served(url, dict(headers))
    total, chunk = 200, os.urandom(1 << 20)
    sent = 0
    async with httpx.AsyncClient(timeout=None) as client, aconnect_ws(url, client, headers=headers) as ws:
        await ws.send_text("stall:300")

        async def flood() -> None:
            nonlocal sent
            for _ in range(total):
                await ws.send_bytes(chunk)
                sent += 1

        flooding = asyncio.create_task(flood())
        try:
            last, still = -1, 0
            while still < 4 and not flooding.done():  # until no message has gone for 4 s
                await asyncio.sleep(1)
                last, still = sent, (still + 1 if sent == last else 0)
            assert not flooding.done() and sent < total // 2, f"{sent} MiB taken while the service read nothing"
        finally:
            flooding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flooding
