"""The shared bounded HTTP server (``adx._httpserver``, h11) beside a bare hand-written asyncio responder.

    uv run python bench/bench_httpserver.py [--n 2000]

Both servers run in their own process on a Unix socket and answer a fixed JSON body; the client is one raw
keep-alive socket (no HTTP library in the numbers). Figures: a POST with a 2-byte body (sandboxd's typical
call) and with a 1 MiB body, each on the shared server (with sandboxd's limits) and on the baseline: the
bare responder reads the head with ``readuntil`` and the body with ``readexactly`` -- what sandboxd's server
did before, without any of the caps.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from _harness import emit, progress, summarize, time_calls
from bench_execd import RawClient, wait_socket

BARE = r"""
import asyncio, sys
BODY = b'{"status":"ok"}'
RESP = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
async def handle(r, w):
    while True:
        try:
            head = await r.readuntil(b"\r\n\r\n")
        except Exception:
            break
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await r.readexactly(length)
        w.write(RESP)
        await w.drain()
    w.close()
async def main():
    server = await asyncio.start_unix_server(handle, sys.argv[1], limit=1 << 16)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""

SHARED = r"""
import asyncio, sys
from adx._httpserver import HttpResponse, serve_http
from adx.sandboxd._http import LIMITS
BODY = b'{"status":"ok"}'
async def answer(request):
    return HttpResponse(200, BODY)
async def handle(r, w):
    await serve_http(r, w, answer, lambda status, message: b"{}", LIMITS)
async def main():
    server = await asyncio.start_unix_server(handle, sys.argv[1], limit=1 << 16)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


def measure(code: str, path: str, n: int) -> dict[str, dict[str, float | int]]:
    proc = subprocess.Popen([sys.executable, "-c", code, path])
    try:
        wait_socket(path)
        client = RawClient(path)
        small, big = b"{}", b"x" * (1 << 20)
        out = {
            "post_2_bytes": summarize(time_calls(lambda: client.request("POST", "/v1/List", small), n, warmup=50)),
            "post_1_mib": summarize(time_calls(lambda: client.request("POST", "/v1/List", big), n // 10, warmup=5)),
        }
        client.close()
        return out
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bh", dir="/tmp")
    figures = {}
    for name, code in (("baseline_bare_asyncio", BARE), ("shared_h11_server", SHARED)):
        progress(name)
        figures[name] = measure(code, os.path.join(tmp, f"{name}.sock"), args.n)
        time.sleep(0.2)
    figures["p50_over_baseline"] = {
        k: round(figures["shared_h11_server"][k]["p50_ms"] / figures["baseline_bare_asyncio"][k]["p50_ms"], 2)
        for k in ("post_2_bytes", "post_1_mib")
    }
    emit("httpserver", figures)


if __name__ == "__main__":
    main()
