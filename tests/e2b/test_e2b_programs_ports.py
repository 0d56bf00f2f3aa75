"""Small programs of the kind in E2B's docs, run with the real ``e2b`` SDK (sync and async) against ``adx up``: a
server started in the sandbox in the background, reached at ``get_host(port)`` with httpx, sent request bodies,
and seeing the sandbox host name as ``Host``.

The server is Python's own ``http.server``, which reads a request body by its Content-Length only (as many
small services do): a body forwarded chunked reached it empty.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import AsyncSandbox, Sandbox

pytestmark = pytest.mark.slow

_SERVER = """
import hashlib, json
from http.server import BaseHTTPRequestHandler, HTTPServer

class Echo(BaseHTTPRequestHandler):
    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        sha = hashlib.sha256(data).hexdigest()
        body = json.dumps({"method": self.command, "size": len(data), "sha": sha, "host": self.headers["Host"]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())
    do_PUT = do_POST

HTTPServer(("0.0.0.0", 8000), Echo).serve_forever()
"""


def _echo(data: bytes, method: str, host: str) -> dict[str, object]:
    """The server's answer: what it read, and the Host it was sent (E2B's proxy passes the sandbox host name on,
    as a service that checks its Host, e.g. a dev server's allowed hosts, expects)."""
    return {"method": method, "size": len(data), "sha": hashlib.sha256(data).hexdigest(), "host": host}


def test_request_bodies_reach_a_server_in_the_sandbox(adx_up: Up) -> None:
    sandbox = Sandbox.create(**adx_up.opts())
    try:
        sandbox.files.write("server.py", _SERVER)
        sandbox.commands.run("python3 server.py", background=True, timeout=0)
        # get_host's name reaches the API when sent as Host (docs/e2b.md: Python does not resolve *.localhost).
        with httpx.Client(base_url=adx_up.url, headers={"Host": sandbox.get_host(8000)}, timeout=60) as client:
            deadline = time.monotonic() + 30
            while client.post("/", content=b"ping").status_code != 200:
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.3)
            for data in (b"x" * 10, b"y" * 300_000, bytes(range(256)) * 4096):
                answer = client.post("/upload", content=data)
                assert (answer.status_code, answer.json()) == (200, _echo(data, "POST", sandbox.get_host(8000)))
            answer = client.put("/item", json={"a": 1})
            assert answer.json() == _echo(b'{"a":1}', "PUT", sandbox.get_host(8000))
    finally:
        sandbox.kill()


async def test_request_bodies_reach_a_server_in_the_sandbox_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(**adx_up.opts())
    try:
        await sandbox.files.write("server.py", _SERVER)
        await sandbox.commands.run("python3 server.py", background=True, timeout=0)
        headers = {"Host": sandbox.get_host(8000)}
        async with httpx.AsyncClient(base_url=adx_up.url, headers=headers, timeout=60) as client:
            deadline = time.monotonic() + 30
            while (await client.post("/", content=b"ping")).status_code != 200:
                assert time.monotonic() < deadline, "the server did not come up"
                await asyncio.sleep(0.3)
            data = b"z" * 1_000_000
            answer = await client.post("/upload", content=data)
            assert (answer.status_code, answer.json()) == (200, _echo(data, "POST", sandbox.get_host(8000)))
    finally:
        await sandbox.kill()
