"""Where a cold create's time goes (issue 13's full create: user namespace, disk quota, egress); ONE JSON object.

- ``create_to_running_ms``: the client's create call, as bench_sandboxd.py measures it;
- ``sandboxd_phases_p50_ms``: sandboxd's own debug timings of the same creates (``create timings``): ``layer``
  (the btrfs subvolume and its qgroup limit: two ioctls since 2026-12-04, two ``btrfs`` processes before),
  ``policy`` (the sandbox's nftables chain: libnftables in process, one ``nft -f`` before; beside ``layer``),
  ``prepare`` (everything before the spawner is asked: dir, layer, policy, control socket), ``spawn`` (until
  the supervisor's start report), and the supervisor's own steps, each in ms from its spec's arrival to the
  step's end: ``sup_pump``, ``sup_cgroup``, ``sup_prepared`` (init in its cgroups, mounts sent, veth made),
  ``sup_locked`` (the record commit seen), ``sup_identity``, ``sup_go``, ``sup_exec`` (the init exec'd);
- ``tools_p50_ms``: the native tools alone, same run: fork+exec of ``/bin/true`` from Python (the floor of every
  one of them), ``btrfs subvolume create`` + ``qgroup limit`` on the daemon's pool, ``nft -f`` of a one-chain
  script, ``ip -batch`` of a veth pair like the supervisor's.

Usage: ``uv run python bench/bench_create_phases.py [--n 30]``. Needs root, cgroups, overlayfs, btrfs-progs, nft.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_sandboxd import cleanup_cgroups, pct, start_daemon, summary_ms

from adx.sandboxd import CreateRequest, SandboxdClient, ref_of


async def _creates(sock: Path, n: int) -> list[float]:
    async with SandboxdClient(sock) as c:
        for i in range(3):
            await c.delete(ref_of(await c.create(CreateRequest(request_id=f"w{i}", argv=["sleep", "1000"]))))
        times, refs = [], []
        for i in range(n):
            t = time.perf_counter()
            refs.append(ref_of(await c.create(CreateRequest(request_id=f"c{i}", argv=["sleep", "1000"]))))
            times.append(time.perf_counter() - t)
        for ref in refs:
            await c.delete(ref)
    return times


def _timed(argv: list[str], stdin: bytes | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(argv, input=stdin, capture_output=True, check=True)
    return time.perf_counter() - t


def _tools(pool_mount: Path, n: int) -> dict[str, float]:
    out: dict[str, list[float]] = {"fork_exec_true": [], "btrfs_subvolume_and_qgroup": [], "nft_f": [], "ip_batch": []}
    for i in range(n):
        out["fork_exec_true"].append(_timed(["/bin/true"]))
        sub = pool_mount / f"bench-{i}"
        t = time.perf_counter()
        subprocess.run(["btrfs", "subvolume", "create", str(sub)], capture_output=True, check=True)
        subprocess.run(["btrfs", "qgroup", "limit", str(1 << 30), str(sub)], capture_output=True, check=True)
        out["btrfs_subvolume_and_qgroup"].append(time.perf_counter() - t)
        subprocess.run(["btrfs", "subvolume", "delete", str(sub)], capture_output=True, check=False)
        table = f"adxbench{i}"
        script = f"add table inet {table}\nadd chain inet {table} sb_x\nadd rule inet {table} sb_x accept\n"
        out["nft_f"].append(_timed(["nft", "-f", "-"], script.encode()))
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, check=False)
        batch = f"link add axb{i} type veth peer name axp{i}\naddr add 10.254.0.1/30 dev axb{i}\nlink set axb{i} up\n"
        out["ip_batch"].append(_timed(["ip", "-batch", "-"], batch.encode()))
        subprocess.run(["ip", "link", "del", f"axb{i}"], capture_output=True, check=False)
    return {name: round(pct(values, 50) * 1000, 2) for name, values in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30)
    args = parser.parse_args()
    parent = f"adx-bench-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="adxbench-", dir="/tmp"))
    proc = None
    figures: dict[str, Any] = {}
    try:
        # debug: sandboxd's per-create timings
        top = 'user_namespace = "on"\ndisk_quota = "btrfs"\nwarm_pool = 0\n[logging]\nlevel = "debug"\n'
        proc, sock = start_daemon(work, parent, top, 'network = "veth"\n')
        figures["create_to_running_ms"] = summary_ms(asyncio.run(_creates(sock, args.n)))
        phases: dict[str, list[float]] = {}
        for line in (work / "sandboxd.log").read_text().splitlines():
            if 'msg="create timings"' in line:
                for name, value in re.findall(r"(\w+)_ms=([\d.]+)", line):
                    phases.setdefault(name, []).append(float(value) / 1000)
        figures["sandboxd_phases_p50_ms"] = {k: round(pct(v[3:], 50) * 1000, 2) for k, v in phases.items()}
        figures["tools_p50_ms"] = _tools(work / "state.storage", args.n)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        cleanup_cgroups(parent)
        subprocess.run(["umount", str(work / "state.storage")], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
