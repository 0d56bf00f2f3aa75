"""The Ingress's client to the Relays (``adx.ingress._relay_client``) against a real mutual-TLS uvicorn server:
connections are reused, one the server dropped is replaced for an idempotent request but never for a command,
bodies stream both ways, repeated answer headers pass as they came, and a Relay that is not there is a
connect error (nothing sent)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from adx._certs import Identity, client_ssl_context, component_paths, init_ca, issue
from adx.ingress._relay_client import RelayClient, RelayConnectError, RelayRequest, RelayTransportError
from adx.node._relay import RelayServer, serve_asgi


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []  # the client address of every request: same port = same connection
        self.seen: list[str] = []
        self.app = Starlette(
            routes=[
                Route("/echo", self.echo, methods=["POST", "PUT"]),
                Route("/cookies", self.cookies, methods=["GET"]),
            ]
        )

    async def echo(self, request: Request) -> StreamingResponse:
        assert request.client is not None
        self.peers.append((request.client.host, request.client.port))
        body = await request.body()
        self.seen.append(f"{request.method} {body.decode()}")

        async def stream() -> AsyncIterator[bytes]:
            for part in (b"got:", body):
                yield part

        return StreamingResponse(stream(), media_type="text/plain")

    async def cookies(self, request: Request) -> Response:
        response = Response(b"ok")
        response.raw_headers.append((b"set-cookie", b"a=1"))
        response.raw_headers.append((b"set-cookie", b"b=2"))
        return response


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[tuple[Server, RelayServer, RelayClient, str]]:
    init_ca(tmp_path)
    issue(tmp_path, Identity("node", "n1"))
    issue(tmp_path, Identity("api", "main"))
    server = Server()
    address = f"127.0.0.1:{_free_port()}"
    serving = await serve_asgi(server.app, address, component_paths(tmp_path, Identity("node", "n1")), "relay")
    client = RelayClient(
        client_ssl_context(component_paths(tmp_path, Identity("api", "main"))), timeout=10, connect_timeout=5
    )
    try:
        yield server, serving, client, address
    finally:
        await client.aclose()
        await serving.stop()


async def test_connections_are_reused_and_bodies_stream_both_ways(relay) -> None:
    server, _, client, address = relay

    async def body() -> AsyncIterator[bytes]:
        yield b"str"
        yield b"eamed"

    for content in (b"one", b"two", body()):
        response = await client.send(RelayRequest("POST", address, "/echo", [], content), read_timeout=5)
        assert response.status_code == 200
        assert [chunk async for chunk in response.aiter_raw()] != []
    assert server.seen == ["POST one", "POST two", "POST streamed"]
    assert len(set(server.peers)) == 1, f"one kept connection expected, the server saw {server.peers}"


async def test_a_dropped_connection_is_replaced_for_put_but_not_for_a_command(relay) -> None:
    server, serving, client, address = relay
    first = await client.send(RelayRequest("PUT", address, "/echo", [], b"a"), read_timeout=5)
    assert await first.aread() == b"got:a"
    # The server drops its side of every kept connection (as a Relay restarting or expiring it would): the
    # client learns of it only when it reuses the connection.
    for connection in list(serving.server.server_state.connections):
        connection.transport.abort()  # type: ignore[attr-defined]
    again = await client.send(RelayRequest("PUT", address, "/echo", [], b"b"), read_timeout=5)
    assert await again.aread() == b"got:b"

    kept = await client.send(RelayRequest("POST", address, "/echo", [], b"c"), read_timeout=5)
    assert await kept.aread() == b"got:c"
    for connection in list(serving.server.server_state.connections):
        connection.transport.abort()  # type: ignore[attr-defined]
    with pytest.raises(RelayTransportError):
        await client.send(RelayRequest("POST", address, "/echo", [], b"never twice"), read_timeout=5)
    assert "POST never twice" not in server.seen


async def test_repeated_answer_headers_pass_as_they_came(relay) -> None:
    _, _, client, address = relay
    response = await client.send(RelayRequest("GET", address, "/cookies", [], b""), read_timeout=5)
    assert await response.aread() == b"ok"
    assert [v for k, v in response.headers if k.lower() == "set-cookie"] == ["a=1", "b=2"]


async def test_no_relay_there_is_a_connect_error(relay) -> None:
    _, _, client, _ = relay
    with pytest.raises(RelayConnectError):
        await client.send(RelayRequest("POST", f"127.0.0.1:{_free_port()}", "/echo", [], b"x"), read_timeout=5)
