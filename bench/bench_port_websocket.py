"""WebSocket through port routing: a small message's echo round trip through ADX beside a direct connection to
the sandbox's port, on a real ``adx up`` cluster, in the same run.

    uv run python bench/bench_port_websocket.py [--rounds 500] [--big-rounds 20]

One Environment runs the stdlib WebSocket echo server of the tests (tests/e2b/ws_echo_server.py) on a port.
Three WebSockets stay open, all driven by the same client code (adx._wsproxy.WebSocketClient, so the client's
own cost is the same on every path):

- ``direct``: connected to ``127.0.0.1:PORT`` inside the sandbox's network namespace (as the node's Relay
  connects; the baseline: the echo server's and the client's own cost);
- ``native_route``: ``ws://API/v1/environments/{id}/ports/PORT/...`` with the tenant key (client -> API/Ingress
  -> Relay over mTLS -> sandbox);
- ``get_host``: the same through the ``PORT-ID.DOMAIN`` host name (``Host`` header).

Each round echoes one 32-byte text message on each, in a rotating order (drift hits all alike);
``overhead_p50_ms`` is the p50 minus the direct p50. ``http_get_native_route`` (one plain GET per round on the
same port route, a kept-alive connection) shows what a request costs that the WebSocket's messages do not pay.
Then ``--big-rounds`` echoes of a 1 MiB binary message, direct and through the native route.

Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from _harness import emit, progress, summarize
from bench_api import start_cluster, stop_cluster, wait_deleted

import adx
from adx._wsproxy import Refused, WebSocketClient
from adx.errors import UnavailableError
from adx.node._ports import NamespaceConnector

PORT = 8765
SERVER = Path(__file__).resolve().parents[1] / "tests" / "e2b" / "ws_echo_server.py"
SMALL = "x" * 32


def server_netns(marker: str, within: float = 30) -> Path:
    """The network namespace of the sandbox's echo server (its process, seen from the host's /proc; ``marker``,
    its log's path, names this run's)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.endswith(b"ws_echo_server.py") for part in cmdline) and marker.encode() in cmdline:
                return proc / "ns" / "net"
        time.sleep(0.2)
    raise SystemExit("the echo server did not start in the sandbox")


async def open_ws(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, target: str, headers: list[tuple[str, str]]
) -> WebSocketClient:
    opened = await WebSocketClient.open(
        reader, writer, host=host, target=target, headers=headers, subprotocols=[], handshake_seconds=60
    )
    if isinstance(opened, Refused):
        raise SystemExit(f"refused {target}: {opened.status} {opened.body!r}")
    return opened


async def echo(ws: WebSocketClient, message: str | bytes) -> None:
    await ws.send(message)
    answer = await ws.receive()
    assert answer == message, answer


async def measure(url: str, key: str, env_id: str, host_name: str, rounds: int, big_rounds: int) -> dict[str, object]:
    api = urlsplit(url)
    assert api.hostname is not None and api.port is not None
    connector = NamespaceConnector()
    netns = server_netns(log_of(env_id))
    for _ in range(150):  # the process is there: wait until it listens
        try:
            sock = await connector.connect(netns, PORT)
            break
        except UnavailableError:
            await asyncio.sleep(0.2)
    reader, writer = await asyncio.open_connection(sock=sock)
    direct = await open_ws(reader, writer, f"127.0.0.1:{PORT}", "/bench", [])
    path = f"/v1/environments/{env_id}/ports/{PORT}/bench"
    reader, writer = await asyncio.open_connection(api.hostname, api.port)
    native = await open_ws(reader, writer, api.netloc, path, [("authorization", f"Bearer {key}")])
    reader, writer = await asyncio.open_connection(api.hostname, api.port)
    hosted = await open_ws(reader, writer, host_name, "/bench", [])
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:

        async def http_get() -> None:
            answer = await http.get(path)
            assert answer.status_code == 200, answer.text

        variants: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("direct", lambda: echo(direct, SMALL)),
            ("native_route", lambda: echo(native, SMALL)),
            ("get_host", lambda: echo(hosted, SMALL)),
            ("http_get_native_route", http_get),
        ]
        samples: dict[str, list[float]] = {name: [] for name, _ in variants}
        for _ in range(20):  # warm: connections, caches
            for _, call in variants:
                await call()
        progress(f"{rounds} rounds of a {len(SMALL)}-byte echo")
        for i in range(rounds):
            for name, call in variants[i % 4 :] + variants[: i % 4]:
                start = time.perf_counter()
                await call()
                samples[name].append(time.perf_counter() - start)
    big = bytes(range(256)) * 4096  # 1 MiB
    big_samples: dict[str, list[float]] = {"direct": [], "native_route": []}
    progress(f"{big_rounds} rounds of a 1 MiB echo")
    for i in range(big_rounds):
        pair = [("direct", direct), ("native_route", native)]
        for name, ws in pair[i % 2 :] + pair[: i % 2]:
            start = time.perf_counter()
            await echo(ws, big)
            big_samples[name].append(time.perf_counter() - start)
    for ws in (direct, native, hosted):
        await ws.close()
        ws.writer.close()
    connector.close()
    figures: dict[str, object] = {name: summarize(values) for name, values in samples.items()}
    base = summarize(samples["direct"])["p50_ms"]
    figures["overhead_p50_ms"] = {
        name: round(float(summarize(samples[name])["p50_ms"]) - float(base), 3)
        for name in ("native_route", "get_host", "http_get_native_route")
    }
    figures["echo_1mib"] = {name: summarize(values) for name, values in big_samples.items()}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--big-rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="adx-bench-ws-", dir="/tmp") as tmp:
        progress("starting adx up")
        proc, url, key = start_cluster(Path(tmp))
        try:
            with adx.Client(api_url=url, api_key=key) as client:
                env = client.environments.create(cpu=1, memory="256Mi")
                env.files.write("/tmp/ws_echo_server.py", SERVER.read_bytes())
                started = httpx.post(  # a background command (the SDK's run waits for the end)
                    f"{url}/v1/environments/{env.id}/commands",
                    json={"command": f"python3 /tmp/ws_echo_server.py {PORT} {log_of(env.id)}", "background": True},
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=60,
                )
                assert started.status_code == 201, started.text
                host_name = host_of(url, key, env.id)
                figures = asyncio.run(measure(url, key, env.id, host_name, args.rounds, args.big_rounds))
                env.delete()
                wait_deleted(env)
        finally:
            stop_cluster(proc)
    emit("port_websocket", figures)


def log_of(env_id: str) -> str:
    return f"/tmp/ws-{env_id}.log"


def host_of(url: str, key: str, env_id: str) -> str:
    """``get_host(PORT)`` of the Environment: the E2B API's ``domain`` of the sandbox (the same Environment)."""
    answer = httpx.get(f"{url}/sandboxes/{env_id}", headers={"X-API-Key": key}, timeout=30)
    answer.raise_for_status()
    return f"{PORT}-{env_id}.{answer.json()['domain']}"


if __name__ == "__main__":
    main()
