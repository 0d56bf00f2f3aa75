"""Time to interactive, the ComputeSDK sandbox benchmark's method, against ``adx up`` (issue 16).

    uv run python bench/bench_tti.py [--n 100] [--modes sequential,staggered,burst] [--sdks native,e2b]

TTI is one create call to the first command's result: ``node -v`` when the sandbox image has node, else
``python3 -V`` (the JSON's ``command`` and ``node_in_image`` say which). Deletes are not timed. Modes:

- ``sequential``: n times create, run, delete, one after the other;
- ``staggered``: a new create every ``--stagger-ms`` (200 ms), each in its own thread;
- ``burst``: n creates at once;
- ``interleaved``: sequential, the SDKs taking turns (one create of each in every round), so a swing of the
  machine's load lands on all of them alike: the mode to compare ``native`` with ``native-poll``.

Each (SDK, mode) reports min, median, p95, p99 (ms) and the success rate. SDKs: the native ``adx`` SDK
(``create(..., wait=--capacity-wait)``: a create refused for capacity waits for room, honouring Retry-After) and
the real ``e2b`` SDK (``Sandbox.create()`` then ``commands.run``; it has no such wait). ``native-poll`` is the
native SDK's path before the server-side wait (issue 16): ``create(wait=False)``, then a plain GET every 15 ms
until ``running`` (nothing primes the route cache, so the first command resolves its route at the Coordinator):
the same-run baseline of ``native``. Every SDK also reports ``running_seen`` (create call until the SDK knows it
runs: for ``e2b``, ``Sandbox.create`` returning) and ``first_command`` (the rest). ``native-egress`` is ``native``
with the network an E2B sandbox gets by default (``{"mode": "egress"}``): the like-for-like partner of ``e2b``
(issue 14's within-1.3x figure).
Baseline, same run: the same command spawned on the host (``subprocess.run``), n times.

``native`` and ``native-poll`` also say how often the CPU limit stalled the sandbox: after each measured run (the
deletes are not timed, nor is this) the bench reads the sandbox's ``cpu.stat`` (found through sandboxd) and reports
``throttled_runs`` (runs whose sandbox was throttled at least once, its start included), ``throttled_ms_p50/max``
over those, and ``sandbox_cpu_ms_p50`` (the sandbox's CPU from its start, a claimed member's early start included).
Sequential modes also report ``cpu_ms_per_cycle``: the CPU each daemon (with the exited children it waited for: the
tools sandboxd runs), all sandboxes (their parent cgroup: warm members' starts included) and the bench client spent
per create + command + delete, which the machine's load does not inflate as it does wall time. Not counted: the
per-sandbox supervisors outside the sandboxes' cgroups.

The cluster's store is seeded with the Debian image of the tests' shared cache (``ADX_TEST_IMAGE_CACHE``, hard
links; built there once, ~2-3 min, if missing), so a run does not pay ``adx up``'s first-start build;
``--no-seed`` leaves the store empty (``adx up`` builds it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _harness import emit, percentile, progress
from bench_api import start_cluster, stop_cluster
from bench_e2b_templates import _seed_debian as seed_debian
from bench_hops import cluster_processes, cpu_seconds
from e2b import Sandbox

import adx
from adx.sandboxd import SandboxdClient
from adx.sandboxd._cgroups import detect_layout

MODES = ("sequential", "staggered", "burst", "interleaved")
SDKS = ("native", "native-egress", "native-poll", "e2b")
#: What an E2B sandbox gets when its create says nothing (internet on): ``native-egress`` asks the native SDK for the
#: same, so "E2B beside native" compares sandboxes set up alike (``native`` has only ``lo``).
E2B_DEFAULT_NETWORK = {"mode": "egress"}
#: The SDK's poll before ``?wait=running`` existed (adx.sdk, until issue 16's change): 15 ms for the first second.
OLD_POLL_SECONDS = 0.015


def stats(samples: list[float], attempts: int) -> dict[str, Any]:
    """The ComputeSDK figures: min, median, p95, p99 in ms over the successful runs, and the success rate."""
    out: dict[str, Any] = {"n": attempts, "ok": len(samples), "success_rate": round(len(samples) / attempts, 4)}
    if samples:
        for name, q in (("median", 50), ("p95", 95), ("p99", 99)):
            out[f"{name}_ms"] = round(percentile(samples, q) * 1e3, 1)
        out["min_ms"] = round(min(samples) * 1e3, 1)
    return out


class Trial:
    """One create-to-first-result measurement per call; failures are counted, with their first few messages."""

    def __init__(self, tti: Callable[[], float | tuple[float, float, CpuStat | None]]) -> None:
        self.tti = tti
        self.samples: list[float] = []
        self.running_seen: list[float] = []  # native SDKs: until the SDK knows it runs
        self.cpu_stats: list[CpuStat] = []  # native SDKs: the sandbox's CPU accounting after each run
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def once(self) -> None:
        try:
            measured = self.tti()
        except Exception as exc:  # a failed create or command is a failed iteration, as in ComputeSDK's
            with self.lock:
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        seconds, running, cpu = measured if isinstance(measured, tuple) else (measured, None, None)
        with self.lock:
            self.samples.append(seconds)
            if running is not None:
                self.running_seen.append(running)
            if cpu is not None:
                self.cpu_stats.append(cpu)

    def figures(self, attempts: int) -> dict[str, Any]:
        figures = stats(self.samples, attempts)
        if self.running_seen:
            figures["running_seen_median_ms"] = round(percentile(self.running_seen, 50) * 1e3, 1)
            rest = [total - running for total, running in zip(self.samples, self.running_seen, strict=True)]
            figures["first_command_median_ms"] = round(percentile(rest, 50) * 1e3, 1)
        if self.cpu_stats:
            throttled = [c.throttled_ms for c in self.cpu_stats if c.nr_throttled]
            figures["throttled_runs"] = len(throttled)
            if throttled:
                figures["throttled_ms_p50"] = round(percentile(throttled, 50), 1)
                figures["throttled_ms_max"] = round(max(throttled), 1)
            figures["sandbox_cpu_ms_p50"] = round(percentile([c.usage_ms for c in self.cpu_stats], 50), 1)
        if self.errors:
            figures["errors"] = sorted(set(self.errors))[:5]
        return figures

    def run(self, mode: str, n: int, stagger: float) -> dict[str, Any]:
        if mode == "sequential":
            for _ in range(n):
                self.once()
        else:
            with ThreadPoolExecutor(max_workers=n) as pool:
                start = time.monotonic()
                for i in range(n):
                    if mode == "staggered":
                        time.sleep(max(0.0, start + i * stagger - time.monotonic()))
                    pool.submit(self.once)
        return self.figures(n)


@dataclass(frozen=True)
class CpuStat:
    """A sandbox's CPU accounting from its start: its cgroup's ``cpu.stat`` and usage."""

    nr_throttled: int
    throttled_ms: float
    usage_ms: float


class SandboxCpu:
    """Reads the CPU accounting of an Environment's sandbox, found through sandboxd (the bench runs as root on
    the node's host)."""

    def __init__(self, sandboxd_socket: Path) -> None:
        self.socket = sandboxd_socket
        self.layout = detect_layout()
        self.parent: str | None = None  # the sandboxes' parent cgroup, relative (known after the first ``of``)

    def all_sandboxes_seconds(self) -> float:
        """CPU of every sandbox of this sandboxd so far, warm members and deleted ones included (the parent
        cgroup's hierarchical usage)."""
        if self.parent is None:
            return 0.0
        if "cpuacct" in self.layout.v1_dirs:
            return int(Path(f"{self.layout.v1_dirs['cpuacct']}/{self.parent}/cpuacct.usage").read_text()) / 1e9
        assert self.layout.v2_dir is not None
        stat = Path(f"{self.layout.v2_dir}/{self.parent}/cpu.stat").read_text().split()
        return int(stat[stat.index("usage_usec") + 1]) / 1e6

    def of(self, env_id: str) -> CpuStat | None:
        cgroup_dir = asyncio.run(self._cgroup_dir(env_id))
        if cgroup_dir is None or self.layout.v2_dir is None:
            return None
        relative = os.path.relpath(cgroup_dir, self.layout.v2_dir)
        self.parent = os.path.dirname(relative)
        v1 = self.layout.v1_dirs
        cpu = f"{v1['cpu']}/{relative}" if "cpu" in v1 else cgroup_dir
        try:
            stat = {k: int(v) for k, v in (line.split() for line in Path(f"{cpu}/cpu.stat").read_text().splitlines())}
            if "cpuacct" in v1:
                usage_ms = int(Path(f"{v1['cpuacct']}/{relative}/cpuacct.usage").read_text()) / 1e6
            else:
                usage_ms = stat.get("usage_usec", 0) / 1e3
        except OSError:
            return None
        # v1 counts throttled_time in ns, v2 throttled_usec in us
        throttled_ms = stat["throttled_time"] / 1e6 if "throttled_time" in stat else stat.get("throttled_usec", 0) / 1e3
        return CpuStat(stat.get("nr_throttled", 0), throttled_ms, usage_ms)

    async def _cgroup_dir(self, env_id: str) -> str | None:
        client = SandboxdClient(self.socket, timeout=10)
        try:
            for sandbox in await client.list():
                if sandbox.metadata.get("adx.env") == env_id and sandbox.native is not None:
                    return sandbox.native.cgroup_dir
        finally:
            await client.aclose()
        return None


def cpu_snapshot(roles: dict[str, list[int]], cpu_of: SandboxCpu) -> dict[str, float]:
    """CPU seconds so far of each daemon (with the exited children it waited for), of all sandboxes, and of this
    process. sandboxd's spawner is counted without its exited children: those are the sandboxes' processes (and
    their supervisors), reaped when a sandbox ends, whose CPU the sandboxes' cgroup already counts."""
    now = {
        role: sum(cpu_seconds(pid, reaped=role != "sandboxd" or i == 0) for i, pid in enumerate(pids))
        for role, pids in roles.items()
    }
    now["sandboxes"] = cpu_of.all_sandboxes_seconds()
    times = os.times()
    now["bench_client"] = times.user + times.system
    now["total"] = sum(now.values())
    return now


def interleaved(trials: dict[str, Trial], n: int) -> dict[str, dict[str, Any]]:
    """n rounds, each SDK once per round in turn (sequential)."""
    for _ in range(n):
        for trial in trials.values():
            trial.once()
    return {sdk: trial.figures(n) for sdk, trial in trials.items()}


def native_tti(
    client: adx.Client,
    argv: list[str],
    cpu: float,
    capacity_wait: float,
    *,
    poll: bool = False,
    network: dict[str, str] | None = None,
    cpu_of: SandboxCpu | None = None,
) -> Callable[[], tuple[float, float, CpuStat | None]]:
    def tti() -> tuple[float, float, CpuStat | None]:
        start = time.perf_counter()
        if poll:  # the SDK before the server-side wait: create, then a GET every 15 ms
            env = client.environments.create(cpu=cpu, memory="256Mi", network=network, wait=False)
            while env.state != "running":
                if env.state in ("failed", "deleting", "deleted"):
                    raise RuntimeError(f"{env.id} is {env.state}")
                time.sleep(OLD_POLL_SECONDS)
                env.refresh()
        else:
            env = client.environments.create(cpu=cpu, memory="256Mi", network=network, wait=capacity_wait)
        running = time.perf_counter() - start
        try:
            result = env.commands.run(argv)
            elapsed = time.perf_counter() - start
            if result.exit_code != 0:
                raise RuntimeError(f"{argv} exited {result.exit_code}: {result.stderr[:200]!r}")
            return elapsed, running, cpu_of.of(env.id) if cpu_of is not None else None
        finally:
            env.delete()

    return tti


def e2b_tti(opts: dict[str, str], command: str) -> Callable[[], tuple[float, float, CpuStat | None]]:
    def tti() -> tuple[float, float, CpuStat | None]:
        start = time.perf_counter()
        sandbox = Sandbox.create(**opts)  # answers once the sandbox runs
        running = time.perf_counter() - start
        try:
            sandbox.commands.run(command)  # raises on a non-zero exit
            return time.perf_counter() - start, running, None
        finally:
            sandbox.kill()

    return tti


def host_baseline(argv: list[str], n: int) -> dict[str, Any]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return stats(samples, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="iterations per SDK and mode")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--sdks", default=",".join(SDKS))
    parser.add_argument("--stagger-ms", type=float, default=200.0)
    parser.add_argument("--cpu", type=float, default=0.5, help="native SDK's CPU request (E2B's default is 0.5)")
    parser.add_argument("--capacity-wait", type=float, default=120.0, help="native create(wait=...), seconds")
    parser.add_argument("--no-seed", action="store_true", help="let adx up build the Debian image (no cache)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    sdks = [s for s in args.sdks.split(",") if s]
    if bad := [m for m in modes if m not in MODES] + [s for s in sdks if s not in SDKS]:
        parser.error(f"unknown mode or SDK: {bad}")
    figures: dict[str, Any] = {"n": args.n, "stagger_ms": args.stagger_ms, "cpu": args.cpu}
    figures["load_average_start"] = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="adx-bench-tti-", dir="/tmp") as tmp:
        if not args.no_seed:
            progress("seeding the Debian image from the tests' cache")
            seed_debian(Path(tmp) / "state")
        progress("starting adx up")
        proc, url, key = start_cluster(Path(tmp))
        opts = {"api_url": url, "sandbox_url": url, "api_key": key}
        cpu_of = SandboxCpu(Path(tmp) / "state" / "sandboxd" / "api" / "sandboxd.sock")
        try:
            with adx.Client(api_url=url, api_key=key) as client:
                probe = client.environments.create(cpu=args.cpu, memory="256Mi")
                has_node = probe.commands.run(["/bin/sh", "-c", "command -v node"]).exit_code == 0
                cpu_of.of(probe.id)  # learns the sandboxes' parent cgroup
                probe.delete()
                roles = cluster_processes(proc.pid)
                command = "node -v" if has_node else "python3 -V"
                argv = shlex.split(command)
                figures["command"], figures["node_in_image"] = command, has_node
                progress(f"TTI to `{command}`; host baseline x{args.n}")
                if shutil.which(argv[0]):
                    figures["baseline_host_spawn"] = host_baseline(argv, args.n)
                else:
                    figures["baseline_host_spawn"] = f"{argv[0]} is not on the host"

                def trial(sdk: str) -> Trial:
                    if sdk == "e2b":
                        return Trial(e2b_tti(opts, command))
                    network = E2B_DEFAULT_NETWORK if sdk == "native-egress" else None
                    return Trial(
                        native_tti(
                            client,
                            argv,
                            args.cpu,
                            args.capacity_wait,
                            poll=sdk == "native-poll",
                            network=network,
                            cpu_of=cpu_of,
                        )
                    )

                if "interleaved" in modes:
                    progress(f"{'/'.join(sdks)} interleaved x{args.n}")
                    for sdk, result in interleaved({sdk: trial(sdk) for sdk in sdks}, args.n).items():
                        figures[f"{sdk}_interleaved"] = result
                        progress(f"  {sdk}: {result}")
                for sdk in sdks:
                    for mode in modes:
                        if mode == "interleaved":
                            continue
                        progress(f"{sdk} {mode} x{args.n}")
                        before = cpu_snapshot(roles, cpu_of)
                        figures[f"{sdk}_{mode}"] = trial(sdk).run(mode, args.n, args.stagger_ms / 1e3)
                        if mode == "sequential":  # one cycle at a time: its CPU, whatever the machine's load
                            after = cpu_snapshot(roles, cpu_of)
                            figures[f"{sdk}_{mode}"]["cpu_ms_per_cycle"] = {
                                role: round((after[role] - before[role]) / args.n * 1e3, 1) for role in after
                            }
                        progress(f"  {figures[f'{sdk}_{mode}']}")
        finally:
            stop_cluster(proc)
            # How many creates claimed a pre-warmed sandbox (sandboxd's warm pool, docs/sandboxd.md).
            logs = [p.read_text(errors="replace") for p in Path(tmp).rglob("*.log") if p.is_file()]
            figures["sandboxd_warm_claims"] = sum(text.count('msg="warm claim"') for text in logs)
    figures["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    emit("tti", figures)


if __name__ == "__main__":
    main()
