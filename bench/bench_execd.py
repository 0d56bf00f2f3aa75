"""execd: command round trip, HTTP overhead, start-up and idle memory, each beside a same-run baseline.

    uv run python bench/bench_execd.py [--n 300]

Figures and their baselines (all in this run, same machine):
- ``true`` run through execd's socket (POST /v1/commands, full NDJSON stream read) beside
  ``subprocess.run(["true"])`` in this process (the cost of the process itself);
- execd's HTTP round trip (GET /v1/health) beside a bare HTTP responder on the same kind of Unix socket
  (an asyncio server answering a fixed response: the floor of any HTTP-over-UDS server in Python);
- execd start-up to first answered request beside a bare ``python -c pass`` interpreter start, and the same
  for execd forked from a warm parent that already imported it (a zygote-style spawner);
- execd idle RSS beside a bare interpreter's RSS;
- with ``--sandboxes N`` (root): on a real sandboxd, sandbox create (``CreateRequest.execd``) -> execd Ready as
  seen on sandboxd's runtime-control subscription, the create call alone, a first ``true`` through the
  host-side execd socket (new connection) and PID 1's idle memory (VmRSS, Pss, private), beside the same
  sandbox created with ``sleep`` as PID 1 (create call only); all of it twice: PID 1 running execd in process
  (sandboxd's default) and, as the baseline, exec'ing a fresh interpreter (``execd_in_process = false``);
- with ``--warm-images N`` (root; only this figure): on one sandboxd with a warm pool, N claims of an execd
  sandbox of the Debian store image (the test cache's, ``tests/helpers/image_cache.py``) and, taking turns, of
  the host-derived image (the same-run baseline): create -> execd Ready (subscription), the create call and a
  first ``true``; then the idle memory of each parked member's PID 1 (issue 16: a store image's member starts
  its interpreter and imports execd before the claim, ``adx.execd._prestart``).
One client connection per figure, kept alive, raw socket client (no HTTP library overhead in the numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import emit, progress, summarize, time_calls

BARE_SERVER = r"""
import asyncio, os, sys
BODY = b'{"status":"ok"}'
RESP = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
async def handle(r, w):
    while True:
        try:
            await r.readuntil(b"\r\n\r\n")
        except Exception:
            break
        w.write(RESP)
        await w.drain()
    w.close()
async def main():
    server = await asyncio.start_unix_server(handle, sys.argv[1])
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


class RawClient:
    """Minimal keep-alive HTTP/1.1 client: enough to read fixed-length and chunked responses."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        self.buf += data

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(marker)
        return head

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def request(self, method: str, path: str, body: bytes = b"") -> bytes:
        self.sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        head = self._until(b"\r\n\r\n").decode("latin-1").lower()
        if "transfer-encoding: chunked" in head:
            out = b""
            while True:
                size = int(self._until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    self._until(b"\r\n")
                    return out
                out += self._exact(size)
                self._exact(2)
        length = int(head.split("content-length:")[1].split("\r\n")[0])
        return self._exact(length)

    def close(self) -> None:
        self.sock.close()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def wait_socket(path: str, timeout: float = 10.0) -> float:
    """Seconds until a request on ``path`` is answered."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        with contextlib.suppress(OSError):
            client = RawClient(path)
            try:
                client.request("GET", "/v1/health")
                return time.perf_counter() - start
            finally:
                client.close()
        time.sleep(0.001)
    raise RuntimeError(f"{path} did not answer")


def start_execd(tmp: str, tag: str) -> tuple[subprocess.Popen[bytes], str, float]:
    sock = f"{tmp}/s{tag}"
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "adx.execd", "--socket", sock, "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # The socket file appears at bind(), a moment before listen(): retry until a request is answered.
    wait_socket(sock)
    return proc, sock, time.perf_counter() - start


def start_forked(tmp: str, tag: str) -> float:
    """execd forked from a warm parent that already imported it (what a zygote-style spawner could do)."""
    from adx.execd._main import main as execd_main

    sock = f"{tmp}/f{tag}"
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: run execd in-process, never return into the benchmark
        code = 1
        try:
            code = execd_main(["--socket", sock, "--log-level", "warning"])
        finally:
            os._exit(code)
    wait_socket(sock)
    seconds = time.perf_counter() - start
    os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)
    return seconds


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pid1_memory_kib(procs: set[int]) -> dict[str, int]:
    """VmRSS, Pss and private (USS) KiB of the sandbox's PID 1 (the process whose NSpid ends in 1)."""
    for pid in procs:
        status = Path(f"/proc/{pid}/status").read_text()
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if nspid[-1] != "1":
            continue
        rollup = {
            line.split(":")[0]: int(line.split()[1])
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
        }
        return {
            "rss": rss_kib(pid),
            "pss": rollup["Pss"],
            "private": rollup["Private_Clean"] + rollup["Private_Dirty"],
        }
    raise RuntimeError("no PID 1 among the sandbox's processes")


async def sandbox_rounds(daemon: Any, rounds: int, tag: str) -> dict[str, Any]:
    """``rounds`` execd sandboxes, one at a time: create call, create -> Ready (runtime-control subscription),
    a first ``true`` through the host-side socket, PID 1's memory after that, then a plain ``sleep`` PID 1."""
    import asyncio

    from adx.sandboxd import CreateRequest, ExecdOptions, ResourcesSpec, RuntimeControlSubscription, ref_of

    creates, totals, bare_creates, first_calls, memory = [], [], [], [], []
    async with daemon.client() as client:
        path = (await client.health()).runtime_control_socket
        assert path is not None
        async with RuntimeControlSubscription(path, max_backoff=0.05) as sub:
            await sub.wait_connected(10)
            for i in range(rounds):
                sid = f"{tag}{i}"
                start = time.perf_counter()
                created = await client.create(
                    CreateRequest(
                        request_id=sid,
                        sandbox_id=sid,
                        argv=["sleep", "1000"],
                        execd=ExecdOptions(python="/usr/bin/python3"),
                        resources=ResourcesSpec(cpu_millis=1000, memory_bytes=128 << 20),
                    )
                )
                created_at = time.perf_counter()
                async with asyncio.timeout(30):
                    while not ((state := sub.states.get(sid)) and state.ready):
                        await sub.next_event()
                ready = time.perf_counter()
                creates.append(created_at - start)
                totals.append(ready - start)
                socket = created.sandbox.execd_socket
                assert socket is not None
                first_calls.append(await asyncio.to_thread(time_true_once, socket))
                await asyncio.sleep(0.2)  # idle
                memory.append(pid1_memory_kib(daemon.cgroup_procs(sid)))
                await client.delete(ref_of(created))

                start = time.perf_counter()
                bare = await client.create(
                    CreateRequest(
                        request_id=f"{tag}t{i}", argv=["sleep", "1000"], resources=ResourcesSpec(cpu_millis=1000)
                    )
                )
                bare_creates.append(time.perf_counter() - start)
                await client.delete(ref_of(bare))
    mib = {k: round(sorted(m[k] for m in memory)[len(memory) // 2] / 1024, 2) for k in ("rss", "pss", "private")}
    return {
        "create_call": summarize(creates),
        "create_to_execd_ready_via_subscription": summarize(totals),
        "true_through_host_side_execd_socket": summarize(first_calls),
        "pid1_idle_memory_mib_median": mib,
        "baseline_create_call_sleep_pid1": summarize(bare_creates),
    }


async def sandbox_figures(rounds: int, tmp: str) -> dict[str, object]:
    """execd as PID 1 the supported way (``CreateRequest.execd``: sandboxd builds the init, mounts its execd
    runtime, binds the sockets host-side); Ready is read from sandboxd's runtime-control subscription.

    Twice, in this run: as sandboxd starts it by default (PID 1 forked from a template that imported execd, no
    exec: ``execd_in_process``), and exec'ing a fresh ``python3 -m adx.execd`` (``execd_in_process = false``),
    the baseline. The two daemons run one after the other, never at the same time."""
    from sbx_helpers import DaemonFactory  # the sandboxd test harness: unique cgroup parent, full cleanup

    base = Path(tmp) / "sbx"
    base.mkdir()
    factory = DaemonFactory(base)
    try:
        in_process = factory("inproc")
        figures = {"in_process": await sandbox_rounds(in_process, rounds, "i")}
        in_process.stop()
        figures["baseline_exec"] = await sandbox_rounds(factory("exec", execd_in_process=False), rounds, "e")
    finally:
        factory.cleanup()
    return {"sandbox_execd": figures}


async def _pool_settled(client: Any, at_least: int = 0) -> int:
    """Wait until no member is starting and at least ``at_least`` are ready; returns how many are ready."""
    import asyncio

    deadline = time.monotonic() + 120
    while True:
        pool = (await client.health()).warm_pool
        if pool is not None and not pool.starting and pool.ready >= at_least:
            return int(pool.ready)
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm pool did not settle: {pool}")
        await asyncio.sleep(0.02)


def _nspid(pid: int) -> str:
    """``pid`` as its innermost PID namespace numbers it."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("NSpid:"))
    return line.split()[-1]


def _member_pid1_memory(daemon: Any) -> list[dict[str, Any]]:
    """Every parked member's PID 1: its command line (what it runs while parked) and VmRSS/Pss/private KiB."""
    from sbx_helpers import LAYOUT

    assert LAYOUT.v2_root is not None
    members = []
    for cg in sorted((LAYOUT.v2_root / daemon.cgroup_parent).glob("_warm-*")):
        procs = {int(x) for x in (cg / "cgroup.procs").read_text().split()}
        with contextlib.suppress(RuntimeError, OSError):
            memory = pid1_memory_kib(procs)
            pid1 = next(p for p in procs if _nspid(p) == "1")
            cmdline = Path(f"/proc/{pid1}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            members.append({"pid1": cmdline.strip()[:80], "processes": len(procs), **memory})
    return members


async def warm_image_rounds(rounds: int, tmp: str) -> dict[str, Any]:
    """Claims of execd sandboxes, the Debian store image and the host image taking turns (module docstring)."""
    import asyncio

    from image_cache import CACHE, cached_debian_store
    from sbx_helpers import DaemonFactory

    from adx.sandboxd import CreateRequest, ExecdOptions, ResourcesSpec, RuntimeControlSubscription, ref_of

    cached_debian_store()
    base = Path(tmp) / "sbxw"
    base.mkdir()
    factory = DaemonFactory(base, images_dir=CACHE)
    images = {"host": None, "debian": "debian"}
    times: dict[str, dict[str, list[float]]] = {k: {"create": [], "ready": [], "true": []} for k in images}
    claimed_memory: dict[str, list[dict[str, int]]] = {k: [] for k in images}  # PID 1 after its first ``true``
    try:
        daemon = factory("warm", warm_pool=1)
        async with daemon.client() as client:
            path = (await client.health()).runtime_control_socket
            assert path is not None
            async with RuntimeControlSubscription(path, max_backoff=0.05) as sub:
                await sub.wait_connected(10)

                async def one(name: str, sid: str, timed: bool) -> None:
                    start = time.perf_counter()
                    created = await client.create(
                        CreateRequest(
                            request_id=sid,
                            sandbox_id=sid,
                            image=images[name],
                            argv=["sleep", "1000"],
                            execd=ExecdOptions(),
                            resources=ResourcesSpec(cpu_millis=500, memory_bytes=256 << 20),
                        )
                    )
                    created_at = time.perf_counter()
                    async with asyncio.timeout(30):
                        while not ((state := sub.states.get(sid)) and state.ready):
                            await sub.next_event()
                    ready = time.perf_counter()
                    socket = created.sandbox.execd_socket
                    assert socket is not None
                    took_true = await asyncio.to_thread(time_true_once, socket)
                    if timed:
                        times[name]["create"].append(created_at - start)
                        times[name]["ready"].append(ready - start)
                        times[name]["true"].append(took_true)
                        assert created.sandbox.native is not None
                        procs = (Path(created.sandbox.native.cgroup_dir) / "cgroup.procs").read_text().split()
                        claimed_memory[name].append(pid1_memory_kib({int(p) for p in procs}))
                    await client.delete(ref_of(created))

                for i in range(2):  # warm-up: each shape is learned (its first create is cold), caches
                    for name in images:
                        await one(name, f"u{name[0]}{i}", False)
                        await _pool_settled(client)
                kept = await _pool_settled(client)
                before = (await client.health()).warm_pool
                for i in range(rounds):
                    for name in images:
                        await _pool_settled(client, kept)
                        await one(name, f"r{name[0]}{i}", True)
                after = (await client.health()).warm_pool
                await _pool_settled(client, kept)
                await asyncio.sleep(1.0)  # idle members
                members = _member_pid1_memory(daemon)
        assert before is not None and after is not None
        return {
            "warm_claims": {
                "claims": after.claims - before.claims,
                "misses": after.misses - before.misses,
                **{
                    f"{name}_{figure}": summarize(samples)
                    for name, figures in times.items()
                    for figure, samples in figures.items()
                },
                "claimed_pid1_kib_median": {
                    name: {k: sorted(m[k] for m in samples)[len(samples) // 2] for k in ("rss", "pss", "private")}
                    for name, samples in claimed_memory.items()
                },
                "parked_members_pid1_kib": members,
            }
        }
    finally:
        factory.cleanup()


def time_true_once(socket: str) -> float:
    """One ``true`` through execd's host-side socket of a real sandbox (raw HTTP/1.1, one connection)."""
    import socket as sk

    from adx._fs import ShortUnixPath

    body = b'{"argv":["true"]}'
    request = (
        b"POST /v1/commands HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    with ShortUnixPath(Path(socket)) as path, sk.socket(sk.AF_UNIX) as conn:
        start = time.perf_counter()
        conn.connect(path)
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
        took = time.perf_counter() - start
    assert b'"exitCode":0' in data, data
    return took


def percentile_ms(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--starts", type=int, default=15)
    parser.add_argument("--sandboxes", type=int, default=0, help="rounds on a real sandboxd (root only)")
    parser.add_argument("--warm-images", type=int, default=0, help="only the store vs host image claims (root)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bx", dir="/tmp")
    if args.warm_images:
        import asyncio
        import shutil

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
        try:
            emit("execd_warm_images", asyncio.run(warm_image_rounds(args.warm_images, tmp)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    procs: list[subprocess.Popen[bytes]] = []
    try:
        progress("start-up")
        starts = []
        for i in range(args.starts):
            proc, _, seconds = start_execd(tmp, f"st{i}")
            starts.append(seconds)
            stop(proc)
        import adx.execd._main  # noqa: F401 - warm the parent once, outside the timing

        forked_starts = [start_forked(tmp, str(i)) for i in range(args.starts)]
        bare_starts = time_calls(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.starts)

        proc, sock, _ = start_execd(tmp, "main")
        procs.append(proc)
        time.sleep(0.3)
        idle_rss = rss_kib(proc.pid)
        bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        procs.append(bare)
        time.sleep(0.3)
        bare_rss = rss_kib(bare.pid)

        progress("command round trips")
        client = RawClient(sock)
        body = b'{"argv":["true"]}'

        def run_true() -> None:
            out = client.request("POST", "/v1/commands", body)
            if b'"exitCode":0' not in out:
                raise RuntimeError(out)

        through_execd = time_calls(run_true, args.n, warmup=20)
        direct = time_calls(lambda: subprocess.run(["true"], check=True), args.n, warmup=20)
        execd_http = time_calls(lambda: client.request("GET", "/v1/health"), args.n, warmup=50)
        client.close()

        bare_sock = f"{tmp}/bare"
        bare_server = subprocess.Popen([sys.executable, "-c", BARE_SERVER, bare_sock])
        procs.append(bare_server)
        wait_socket(bare_sock)
        bare_client = RawClient(bare_sock)
        bare_http = time_calls(lambda: bare_client.request("GET", "/v1/health"), args.n, warmup=50)
        bare_client.close()

        sandbox: dict[str, object] = {}
        if args.sandboxes:
            import asyncio

            progress("sandboxes")
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
            sandbox = asyncio.run(sandbox_figures(args.sandboxes, tmp))
        emit(
            "execd",
            {
                **sandbox,
                "true_through_execd": summarize(through_execd),
                "baseline_subprocess_run_true": summarize(direct),
                "execd_http_round_trip_health": summarize(execd_http),
                "baseline_bare_asyncio_http_uds_round_trip": summarize(bare_http),
                "execd_start_to_first_answer": summarize(starts),
                "execd_forked_from_warm_parent_to_first_answer": summarize(forked_starts),
                "baseline_python_c_pass": summarize(bare_starts),
                "execd_idle_rss_mib": round(idle_rss / 1024, 2),
                "baseline_bare_python_rss_mib": round(bare_rss / 1024, 2),
            },
        )
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
