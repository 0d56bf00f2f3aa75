"""The Ingress's client to a Relay: ``RelayClient`` (h11 on pooled mutual-TLS connections, now) vs the
``httpx.AsyncClient`` it replaced, against the same real TLS server, in the same run.

    uv run python bench/bench_relay_client.py [--n 500]

A throwaway cluster CA issues a node and an API certificate; a server process serves, over mutual TLS with
uvicorn (as the Relay does), a route that streams a small NDJSON answer like execd's to ``true``. This process
sends the same POST with each client, in alternating blocks, and reads its own CPU time (``time.process_time``)
per request: what the Ingress side of the hop costs, whatever the machine's load. Wall p50 beside it.

Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from _harness import emit, progress, summarize
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from adx._certs import Identity, client_ssl_context, component_paths, init_ca, issue
from adx.ingress._relay_client import RelayClient
from adx.node._relay import serve_asgi

BODY = b'{"command": "true"}'
ANSWER = [b'{"type":"started","pid":42}\n', b'{"type":"exit","exitCode":0}\n']


async def serve(certs: Path, port: int) -> None:
    async def commands(request: Request) -> StreamingResponse:
        await request.body()

        async def stream() -> AsyncIterator[bytes]:
            for line in ANSWER:
                yield line

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    app = Starlette(routes=[Route("/{env_id}/v1/commands", commands, methods=["POST"])])
    await serve_asgi(app, f"127.0.0.1:{port}", component_paths(certs, Identity("node", "n1")), "relay")
    print("ready", flush=True)
    await asyncio.Event().wait()


async def measure(address: str, certs: Path, n: int) -> dict[str, Any]:
    context = client_ssl_context(component_paths(certs, Identity("api", "main")))
    relay = RelayClient(context, timeout=30, connect_timeout=5)
    http = httpx.AsyncClient(verify=context, timeout=httpx.Timeout(30, connect=5))
    headers = [("content-type", "application/json")]

    async def h11_once() -> None:
        response = await relay.send("POST", address, "/env_1/v1/commands", headers, BODY, read_timeout=None)
        body = await response.aread()
        assert response.status_code == 200 and body == b"".join(ANSWER), body

    async def httpx_once() -> None:
        request = http.build_request("POST", f"https://{address}/env_1/v1/commands", headers=headers, content=BODY)
        response = await http.send(request, stream=True)
        body = b"".join([chunk async for chunk in response.aiter_raw()])
        await response.aclose()
        assert response.status_code == 200 and body == b"".join(ANSWER), body

    variants: dict[str, Callable[[], Awaitable[None]]] = {"relay_client_h11_now": h11_once, "httpx_before": httpx_once}
    for once in variants.values():
        for _ in range(20):
            await once()
    cpu = {name: 0.0 for name in variants}
    walls: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(4):  # alternating blocks: a load spike hits both
        for name, once in variants.items():
            started = time.process_time()
            for _ in range(n // 4):
                start = time.perf_counter()
                await once()
                walls[name].append(time.perf_counter() - start)
            cpu[name] += time.process_time() - started
    await relay.aclose()
    await http.aclose()
    return {
        "client_cpu_ms_per_request": {name: round(v / (4 * (n // 4)) * 1e3, 3) for name, v in cpu.items()},
        "wall": {name: summarize(v) for name, v in walls.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(Path(args.serve[0]), int(args.serve[1])))
        return
    figures: dict[str, Any] = {"load_average_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="adx-bench-rc-") as tmp:
        certs = Path(tmp)
        init_ca(certs)
        issue(certs, Identity("node", "n1"))
        issue(certs, Identity("api", "main"))
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(certs), str(port)], stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
            progress(f"x{args.n} per client")
            figures.update(asyncio.run(measure(f"127.0.0.1:{port}", certs, args.n)))
        finally:
            server.kill()
            server.wait()
    figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    emit("relay_client", figures)


if __name__ == "__main__":
    main()
