"""The public path's latency on a real ``adx up`` cluster, each figure beside a baseline of the same run.

    uv run python bench/bench_api.py [--creates 15] [--runs 200]

Figures (issue 5 targets in brackets):
- ``create_to_first_command``: SDK ``create(wait=True)`` then ``commands.run("true")`` [p50 <= 150 ms, goal 60].
  Baseline ``sandboxd_create_until_execd_ready``: the same sandbox (execd as PID 1, same resources) created
  straight on sandboxd's socket, until execd answers its health route; and
  ``sandboxd_create_to_first_command_direct``: that, then ``true`` run straight on execd.
- ``run_true_through_ingress``: ``env.commands.run("true")`` SDK -> API/Ingress -> Relay (mTLS) -> execd
  [p50 <= 10 ms]. Baselines: ``run_true_direct_execd`` (the same request on execd's Unix socket) and
  ``api_healthz`` (a bare GET on the API server: HTTP + uvicorn floor of this machine).
- For attribution: ``of_which_create_request`` (the POST alone) and ``of_which_create_until_running_seen``.

Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
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

import httpx
from _harness import emit, progress, summarize, time_calls

import adx
from adx.model import new_id
from adx.sandboxd import CreateRequest, ExecdOptions, ResourcesSpec, SandboxdClient, ref_of
from adx.sdk import read_credentials

# The Environments' CPU (--cpu-millis). execd's interpreter start runs inside the sandbox's CPU quota, so
# create -> first command grows as the quota shrinks (measured: ~125 ms at 1000, ~220 ms at 250).
CPU_MILLIS = 1000
MEMORY = 128 * 2**20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_cluster(base: Path, settings: str = "") -> tuple[subprocess.Popen[bytes], str, str]:
    """``adx up`` in ``base`` (``settings``: more lines of its TOML config); (process, API URL, API key)."""
    state, xdg = base / "state", base / "xdg"
    config = base / "up.toml"
    config.write_text(f'api_listen = "127.0.0.1:{free_port()}"\n{settings}')
    log = open(base / "up.log", "wb")  # noqa: SIM115 - lives as long as the cluster
    proc = subprocess.Popen(
        [sys.executable, "-m", "adx", "up", "--state-dir", str(state), "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "XDG_CONFIG_HOME": str(xdg)},
        start_new_session=True,
    )
    deadline = time.monotonic() + 600  # a first start's Debian build: 1.5-4 min
    credentials = xdg / "adx" / "credentials.json"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"adx up exited: {(base / 'up.log').read_text()[-3000:]}")
        stored = read_credentials(credentials)
        # "Press Ctrl-C": also the default image is there (a first start builds the Debian base, docs/images.md).
        if stored.get("api_url") and stored.get("api_key") and b"Press Ctrl-C" in (base / "up.log").read_bytes():
            try:
                if httpx.get(stored["api_url"] + "/healthz", timeout=2).status_code == 200:
                    return proc, stored["api_url"], stored["api_key"]
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    raise SystemExit(f"adx up did not come up: {(base / 'up.log').read_text()[-3000:]}")


def stop_cluster(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for ``adx up`` (it stops its daemons), then SIGKILL to its process group after 60 s."""
    progress("stopping adx up")
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # adx up's sandboxd enforces disk with a btrfs pool (disk_quota "auto"), a loop mount beside the state dir that
    # outlives it by design: a bench leaves none behind (lazily: sandboxes the bench did not delete may hold it).
    args = [str(a) for a in proc.args] if isinstance(proc.args, list) else []
    if "--state-dir" in args:
        from adx.errors import AdxError
        from adx.sandboxd._storage import pool_paths, unmount_pool

        with contextlib.suppress(AdxError):
            unmount_pool(pool_paths(Path(args[args.index("--state-dir") + 1]) / "sandboxd" / "data")[1], lazy=True)


def wait_deleted(env: adx.Environment, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while env.refresh().state != "deleted" and time.monotonic() < deadline:
        time.sleep(0.02)


async def sandboxd_baseline(socket_path: Path, rounds: int) -> tuple[list[float], list[float]]:
    """sandboxd create (execd as PID 1) until execd's health answers: what a node's start costs at least; then
    the first command straight on execd (create -> first command without any ADX layer)."""
    client = SandboxdClient(socket_path, timeout=30)
    samples: list[float] = []
    first_command: list[float] = []
    try:
        for _ in range(rounds):
            sandbox_id = new_id("exe")
            start = time.perf_counter()
            created = await client.create(
                CreateRequest(
                    request_id=sandbox_id,
                    sandbox_id=sandbox_id,
                    execd=ExecdOptions(execution_id=sandbox_id),
                    resources=ResourcesSpec(cpu_millis=CPU_MILLIS, memory_bytes=MEMORY),
                )
            )
            assert created.sandbox.execd_socket is not None
            transport = httpx.AsyncHTTPTransport(uds=str(created.sandbox.execd_socket))
            async with httpx.AsyncClient(transport=transport, base_url="http://execd", timeout=5) as execd:
                while True:
                    try:
                        if (await execd.get("/v1/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.001)
                samples.append(time.perf_counter() - start)
                response = await execd.post("/v1/commands", json={"command": "true"})
                assert response.status_code == 200
                first_command.append(time.perf_counter() - start)
            await client.delete(ref_of(created))
    finally:
        await client.aclose()
    return samples, first_command


async def execd_socket_of(socket_path: Path, env_id: str) -> str:
    client = SandboxdClient(socket_path, timeout=30)
    try:
        for sandbox in await client.list():
            if sandbox.metadata.get("adx.env") == env_id and sandbox.execd_socket:
                return str(sandbox.execd_socket)
    finally:
        await client.aclose()
    raise SystemExit(f"no sandbox found for {env_id}")


def main() -> None:
    global CPU_MILLIS
    parser = argparse.ArgumentParser()
    parser.add_argument("--creates", type=int, default=15)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--cpu-millis", type=int, default=CPU_MILLIS, help="CPU of every Environment created")
    args = parser.parse_args()
    CPU_MILLIS = args.cpu_millis
    with tempfile.TemporaryDirectory(prefix="adx-bench-api-", dir="/tmp") as tmp:
        base = Path(tmp)
        progress("starting adx up")
        proc, url, key = start_cluster(base)
        sandboxd_socket = base / "state" / "sandboxd" / "api" / "sandboxd.sock"
        figures: dict[str, Any] = {}
        try:
            with adx.Client(api_url=url, api_key=key) as client:
                warm = client.environments.create(cpu=CPU_MILLIS / 1000, memory=MEMORY)
                warm.commands.run("true")
                warm.delete()
                wait_deleted(warm)

                progress(f"create -> first command x{args.creates}")
                create_samples: list[float] = []
                request_samples: list[float] = []
                running_samples: list[float] = []
                for _ in range(args.creates):
                    start = time.perf_counter()
                    env = client.environments.create(cpu=CPU_MILLIS / 1000, memory=MEMORY, wait=False)
                    request_samples.append(time.perf_counter() - start)
                    env.wait_until_running(60)
                    running_samples.append(time.perf_counter() - start)
                    assert env.commands.run("true").exit_code == 0
                    create_samples.append(time.perf_counter() - start)
                    env.delete()
                    wait_deleted(env)
                progress(f"sandboxd create baseline x{args.creates}")
                baseline, baseline_first = asyncio.run(sandboxd_baseline(sandboxd_socket, args.creates))
                figures["create_to_first_command"] = summarize(create_samples)
                figures["of_which_create_request"] = summarize(request_samples)
                figures["of_which_create_until_running_seen"] = summarize(running_samples)
                figures["sandboxd_create_until_execd_ready"] = summarize(baseline)
                figures["sandboxd_create_to_first_command_direct"] = summarize(baseline_first)

                progress(f"commands.run('true') x{args.runs}")
                env = client.environments.create(cpu=CPU_MILLIS / 1000, memory=MEMORY)
                through = time_calls(lambda: env.commands.run("true"), args.runs, warmup=10)
                execd_socket = asyncio.run(execd_socket_of(sandboxd_socket, env.id))
                transport = httpx.HTTPTransport(uds=execd_socket)
                with httpx.Client(transport=transport, base_url="http://execd", timeout=10) as execd:

                    def direct() -> None:
                        response = execd.post("/v1/commands", json={"command": "true"})
                        assert response.status_code == 200 and b'"exitCode": 0' in response.content.replace(
                            b'"exitCode":0', b'"exitCode": 0'
                        )

                    direct_samples = time_calls(direct, args.runs, warmup=10)
                with httpx.Client(base_url=url, timeout=10) as bare:
                    healthz = time_calls(lambda: bare.get("/healthz"), args.runs, warmup=10)
                figures["run_true_through_ingress"] = summarize(through)
                figures["run_true_direct_execd"] = summarize(direct_samples)
                figures["api_healthz"] = summarize(healthz)
                env.delete()
                wait_deleted(env)
            p50 = figures["create_to_first_command"]["p50_ms"]
            figures["targets"] = {
                "create_to_first_command_p50_le_150ms": p50 <= 150,
                "run_true_through_ingress_p50_le_10ms": figures["run_true_through_ingress"]["p50_ms"] <= 10,
                "create_vs_sandboxd_ratio": round(
                    p50 / figures["sandboxd_create_to_first_command_direct"]["p50_ms"], 2
                ),
                "ingress_vs_direct_execd_ratio": round(
                    figures["run_true_through_ingress"]["p50_ms"] / figures["run_true_direct_execd"]["p50_ms"], 2
                ),
            }
        finally:
            stop_cluster(proc)
    figures["environment_cpu_millis"] = CPU_MILLIS
    emit("api", figures)


if __name__ == "__main__":
    main()
