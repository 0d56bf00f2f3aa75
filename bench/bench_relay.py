"""The Relay's hop to execd: h11 on a fresh Unix-socket connection (now) vs the pooled httpx client (before).

    uv run python bench/bench_relay.py [--n 300]

A real execd (``python -m adx.execd``) on a Unix socket; one server process runs two Relays on loopback
(plain HTTP: TLS is the same on both and is measured by bench_hops.py): ``Relay`` as it is, and ``HttpxRelay``,
whose ``forward`` is the one before this change (a pooled ``httpx.AsyncClient`` per execd socket). The same
POST /v1/commands ``true`` is sent round-robin to both and straight to execd (the baseline), then each in a block
of its own while the Relay process's CPU time (user + system, /proc) is read: ``relay_cpu_ms_per_request`` is
what the hop costs whatever the machine's load.

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
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
from _harness import emit, progress, summarize
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from adx.node._relay import Relay, RelayTarget, _error, serve_asgi

BODY = {"command": "true"}
TICK = os.sysconf("SC_CLK_TCK")


class HttpxRelay(Relay):
    """The Relay's forward before: one pooled httpx client per execd socket (the baseline)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[str, httpx.AsyncClient] = {}

    async def forward(self, request: Request) -> Response:
        env_id = request.path_params["env_id"]
        target = self.resolve(env_id)
        self.streams.opened(env_id)
        client = self._clients.get(env_id)
        if client is None:
            client = self._clients[env_id] = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=str(target.execd_socket), verify=False),
                base_url="http://execd",
                timeout=httpx.Timeout(self.upstream_timeout, read=None),
            )
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in {"host", "connection"}]
        upstream_request = client.build_request(
            request.method,
            "/" + request.path_params["path"],
            params=request.url.query,
            headers=headers,
            content=request.stream(),
        )
        try:
            upstream = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            self.streams.closed(env_id)
            return _error(502, "upstream_unavailable", f"execd of {env_id} did not answer: {exc}")

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                self.streams.closed(env_id)

        response_headers = {k: v for k, v in upstream.headers.items() if k.lower() != "transfer-encoding"}
        return StreamingResponse(body(), status_code=upstream.status_code, headers=response_headers)


async def serve(execd_socket: str, ports: list[int]) -> None:
    """The server process: both Relays, each on its port, until killed."""

    def resolve(env_id: str) -> RelayTarget:
        return RelayTarget(env_id, Path(execd_socket))

    for relay, port in zip((Relay(resolve), HttpxRelay(resolve)), ports, strict=True):
        await serve_asgi(relay.app, f"127.0.0.1:{port}", None, type(relay).__name__)
    print("ready", flush=True)
    await asyncio.Event().wait()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [int(sock.getsockname()[1]) for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--serve", nargs=3, metavar=("SOCKET", "PORT_NEW", "PORT_OLD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve[0], [int(args.serve[1]), int(args.serve[2])]))
        return
    figures: dict[str, Any] = {"load_average_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="adx-bench-relay-") as tmp:
        sock = f"{tmp}/execd.sock"
        execd = subprocess.Popen([sys.executable, "-m", "adx.execd", "--socket", sock, "--log-level", "warning"])
        port_new, port_old = free_ports(2)
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", sock, str(port_new), str(port_old)], stdout=subprocess.PIPE
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
            with (
                httpx.Client(base_url=f"http://127.0.0.1:{port_new}/env_1", timeout=10) as new,
                httpx.Client(base_url=f"http://127.0.0.1:{port_old}/env_1", timeout=10) as old,
                httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://execd", timeout=10) as direct,
            ):

                def run(client: httpx.Client) -> Callable[[], None]:
                    def once() -> None:
                        response = client.post("/v1/commands", json=BODY)
                        assert response.status_code == 200 and b'"exitCode"' in response.content, response.text

                    return once

                variants = {"relay_h11_now": run(new), "relay_httpx_before": run(old), "execd_direct": run(direct)}
                for fn in variants.values():
                    for _ in range(20):
                        fn()
                progress(f"round-robin x{args.n}")
                samples: dict[str, list[float]] = {name: [] for name in variants}
                for _ in range(args.n):
                    for name, fn in variants.items():
                        start = time.perf_counter()
                        fn()
                        samples[name].append(time.perf_counter() - start)
                figures["wall_round_robin"] = {name: summarize(v) for name, v in samples.items()}
                cpu: dict[str, float] = {}
                for _ in range(3):  # alternate blocks, so a load spike hits both
                    for name in ("relay_h11_now", "relay_httpx_before"):
                        before = cpu_seconds(server.pid)
                        for _ in range(args.n):
                            variants[name]()
                        cpu[name] = cpu.get(name, 0.0) + cpu_seconds(server.pid) - before
                figures["relay_cpu_ms_per_request"] = {
                    name: round(v / (3 * args.n) * 1e3, 3) for name, v in cpu.items()
                }
                progress(f"{figures}")
        finally:
            server.kill()
            execd.kill()
            server.wait()
            execd.wait()
    wall = figures["wall_round_robin"]
    figures["hop_p50_ms"] = {
        name: round(wall[name]["p50_ms"] - wall["execd_direct"]["p50_ms"], 3)
        for name in ("relay_h11_now", "relay_httpx_before")
    }
    figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    emit("relay", figures)


if __name__ == "__main__":
    main()
