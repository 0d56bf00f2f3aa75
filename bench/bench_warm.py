"""Warm pool (issue 16) vs cold create, beside the bare ``clone3`` spawn in the same run; prints ONE JSON object.

Every figure is sandboxd's create call until the workload has exec'd (``create_to_running``, as bench_sandboxd.py
measures it) with user namespace, disk quota (btrfs) and egress (veth + the default policy) on: issue 13's
"full" create, target p50 <= 15 ms and <= 6x the bare spawn.

- ``cold``: a daemon with ``warm_pool = 0``;
- ``warm_claim``: a daemon with ``warm_pool = 2``, each create once the pool is full again (the claim itself);
- ``warm_back_to_back``: the same daemon, creates back to back (``--gap`` ms apart): once the pool is drained
  creates go cold until the refill catches up; the claim/miss counts say how many were claims.
- ``burst`` (``--burst N``, 0 to skip): on the same daemon, N creates at once, then (same-run baseline) N one
  after the other: each create's time and the wall time of all N. A burst whose wall time is near the
  sequential one's says sandboxd (or the spawner behind it) serializes creates; ``burst_overlap`` is the
  sequential wall over the burst's (1: no overlap at all).

Usage: ``uv run python bench/bench_warm.py [--n 30] [--gap 0] [--burst 0] [--burst-only]``.
Needs root, cgroups, overlayfs, btrfs-progs, nft.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_sandboxd import BARE, cleanup_cgroups, start_daemon, summary_ms

from adx.sandboxd import CreateRequest, SandboxdClient, ref_of

FULL_TOP = 'user_namespace = "on"\ndisk_quota = "btrfs"\n'
FULL_DEFAULTS = 'network = "veth"\n'


async def _pool_full(c: SandboxdClient, size: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        pool = (await c.health()).warm_pool
        if pool is not None and pool.ready >= size:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"warm pool did not fill: {pool}")
        await asyncio.sleep(0.02)


async def _creates(sock: Path, n: int, mode: str, gap: float) -> dict[str, Any]:
    async with SandboxdClient(sock) as c:
        for i in range(3):  # warm-up: caches, the spawner's first zygotes
            if mode != "cold":
                await _pool_full(c, 2)
            await c.delete(ref_of(await c.create(CreateRequest(request_id=f"w{i}", argv=["sleep", "1000"]))))
        before = (await c.health()).warm_pool
        times, refs = [], []
        for i in range(n):
            if mode == "warm_claim":
                await _pool_full(c, 2)
            elif gap:
                await asyncio.sleep(gap)
            t = time.perf_counter()
            created = await c.create(CreateRequest(request_id=f"c{i}", argv=["sleep", "1000"]))
            times.append(time.perf_counter() - t)
            refs.append(ref_of(created))
        after = (await c.health()).warm_pool
        for ref in refs:
            await c.delete(ref)
    out: dict[str, Any] = {"create_to_running_ms": summary_ms(times)}
    if before is not None and after is not None and mode != "cold":
        out["claims"] = after.claims - before.claims
        out["misses"] = after.misses - before.misses
    return out


async def _burst(sock: Path, n: int) -> dict[str, Any]:
    async with SandboxdClient(sock) as c:
        await _pool_full(c, 2)
        before = (await c.health()).warm_pool

        async def one(tag: str) -> tuple[float, Any]:
            t = time.perf_counter()
            created = await c.create(CreateRequest(request_id=f"{tag}-{uuid.uuid4().hex[:8]}", argv=["sleep", "1000"]))
            return time.perf_counter() - t, ref_of(created)

        t0 = time.perf_counter()
        burst = await asyncio.gather(*(one("b") for _ in range(n)))
        burst_wall = time.perf_counter() - t0
        after = (await c.health()).warm_pool
        for _, ref in burst:
            await c.delete(ref)
        await _pool_full(c, 2)
        t0 = time.perf_counter()
        sequential = [await one("s") for _ in range(n)]
        sequential_wall = time.perf_counter() - t0
        for _, ref in sequential:
            await c.delete(ref)
    out: dict[str, Any] = {
        "n": n,
        "burst_create_ms": summary_ms([t for t, _ in burst]),
        "burst_wall_ms": round(burst_wall * 1e3, 1),
        "sequential_create_ms": summary_ms([t for t, _ in sequential]),
        "sequential_wall_ms": round(sequential_wall * 1e3, 1),
        "burst_overlap": round(sequential_wall / burst_wall, 2),
    }
    if before is not None and after is not None:
        out["burst_claims"], out["burst_misses"] = after.claims - before.claims, after.misses - before.misses
    return out


def _run(name: str, warm_pool: int, n: int, gap: float, modes: list[str], burst: int = 0) -> dict[str, Any]:
    parent = f"adx-bench-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="adxbench-", dir="/tmp"))
    proc = None
    out: dict[str, Any] = {}
    try:
        proc, sock = start_daemon(work, parent, FULL_TOP + f"warm_pool = {warm_pool}\n", FULL_DEFAULTS)
        for mode in modes:
            out[mode] = asyncio.run(_creates(sock, n, mode, gap))
        if burst:
            out["burst"] = asyncio.run(_burst(sock, burst))
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        cleanup_cgroups(parent)
        subprocess.run(["umount", str(work / "state.storage")], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--gap", type=float, default=0.0, help="ms between back-to-back creates")
    parser.add_argument("--burst", type=int, default=0, help="creates at once on the warm daemon (0: skip)")
    parser.add_argument("--burst-only", action="store_true", help="skip the cold, claim and back-to-back figures")
    args = parser.parse_args()
    if args.burst_only:
        print(json.dumps(_run("warm", 2, args.n, 0, [], args.burst)))
        return
    bare = summary_ms(
        json.loads(
            subprocess.run([sys.executable, "-c", BARE, str(args.n)], capture_output=True, check=True, text=True).stdout
        )
    )
    figures: dict[str, Any] = {"baseline_bare_clone3_true_ms": bare}
    figures.update(_run("cold", 0, args.n, 0, ["cold"]))
    figures.update(_run("warm", 2, args.n, args.gap / 1000, ["warm_claim", "warm_back_to_back"], args.burst))
    for mode in ("cold", "warm_claim", "warm_back_to_back"):
        figures[mode]["p50_over_bare_clone3"] = round(figures[mode]["create_to_running_ms"]["p50"] / bare["p50"], 2)
    claim = figures["warm_claim"]["create_to_running_ms"]["p50"]
    figures["targets"] = {"create_p50_ms": 15, "create_p50_over_bare_clone3": 6}
    figures["meets_targets_warm_claim"] = claim <= 15 and claim <= 6 * bare["p50"]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
