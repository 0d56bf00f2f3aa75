"""The Relay's answer when an Environment stops running while a request is on its way to its execd (found by
schemathesis in CI: a kill racing a delete got 502 "execd did not answer: Connection reset by peer")."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adx.errors import NotFoundError
from adx.node._relay import Relay, RelayTarget


@pytest.fixture
def resetting_execd(tmp_path: Path) -> Iterator[Path]:
    """A Unix socket whose every connection is reset at once (execd killed under it)."""
    path = tmp_path / "execd.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    stop.set()
    server.close()


@pytest.mark.req("NOD-12")
async def test_a_request_whose_environment_went_away_meanwhile_gets_its_answer_not_502(resetting_execd: Path) -> None:
    gone: set[str] = set()

    def resolve(env_id: str) -> RelayTarget:
        if env_id in gone:
            raise NotFoundError(f"environment {env_id} is not running on this node")
        return RelayTarget(env_id, resetting_execd)

    relay = Relay(resolve)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=relay.app), base_url="http://relay") as client:
        # Still running here as far as the node knows: execd not answering is the server's error.
        still = await client.post("/env-a/v1/commands/x/kill", json={})
        assert still.status_code == 502 and still.json()["error"]["code"] == "upstream_unavailable"

        # Deleted between the route lookup and the connection: the reset is the delete's, the answer says so.
        def resolve_then_delete(env_id: str) -> RelayTarget:
            relay.resolve = resolve
            gone.add(env_id)
            return RelayTarget(env_id, resetting_execd)

        relay.resolve = resolve_then_delete
        raced = await client.post("/env-b/v1/commands/x/kill", json={})
        assert raced.status_code == 404, raced.text
        assert raced.json()["error"]["code"] == "not_found"
    await relay.aclose()
