"""Benchmark sandboxd's network modes and egress policy; prints ONE JSON object, each figure beside its baseline.

Figures:
- create-to-running p50/p99 with network ``none`` (lo only), ``egress`` (veth + NAT, no lists) and ``egress`` with
  an allow/deny policy (the nft transaction of the sandbox's chain before the spawn), each beside the bare
  ``clone3`` namespace spawn of ``/bin/true`` measured in the same run;
- policy change latency: ``SetNetwork`` on one running sandbox (resolve, one ``nft -f`` transaction, the fsync'd
  record) beside the same transaction run with ``nft -f`` directly (no sandboxd) and a ``Get`` round trip.

Needs root, cgroups, overlayfs and nft. Usage: ``uv run python bench/bench_netpolicy.py [--n 40]``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
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

from _harness import emit, progress, summarize
from bench_sandboxd import BARE, cleanup_cgroups, start_daemon

from adx.model import NetworkPolicy
from adx.sandboxd import CreateRequest, SandboxdClient, SetNetworkRequest, ref_of
from adx.sandboxd._netpolicy import NetFilter, resolve, table_name

POLICY = NetworkPolicy.model_validate(
    {
        "mode": "egress",
        "allow": ["10.0.0.0/8", "192.168.0.0/16", "2001:db8::/32", "localhost"],
        "deny": ["10.9.0.0/16", "192.168.7.7"],
    }
)
OTHER = NetworkPolicy.model_validate({"mode": "egress", "deny": ["10.0.0.0/8"]})


async def creates(sock: Path, n: int, label: str, **request: Any) -> list[float]:
    samples = []
    async with SandboxdClient(sock) as client:
        for i in range(n):
            t = time.perf_counter()
            created = await client.create(CreateRequest(request_id=f"{label}-{i}", argv=["sleep", "1000"], **request))
            samples.append(time.perf_counter() - t)
            await client.delete(ref_of(created))
    return samples


async def changes(sock: Path, n: int) -> tuple[list[float], list[float], str]:
    async with SandboxdClient(sock) as client:
        created = await client.create(CreateRequest(request_id="change", argv=["sleep", "1000"], network_policy=OTHER))
        ref = ref_of(created)
        host_if = "adxv" + hashlib.sha256(ref.sandbox_id.encode()).hexdigest()[:10]
        change, get = [], []
        for i in range(n):
            t = time.perf_counter()
            await client.set_network(SetNetworkRequest(**ref.model_dump(), policy=POLICY if i % 2 else OTHER))
            change.append(time.perf_counter() - t)
            t = time.perf_counter()
            await client.get(ref)
            get.append(time.perf_counter() - t)
        await client.delete(ref)
    return change, get, host_if


def bare_nft(state_dir: Path, pool: str, host_if: str, n: int) -> list[float]:
    """The same one-sandbox transaction through ``nft -f`` directly (names resolved once, outside the timing)."""
    nf = NetFilter(state_dir, pool)
    nf.ready = True  # the daemon's table exists: add to it like sandboxd does
    scripts = [nf.script(host_if, resolve(POLICY)), nf.script(host_if, resolve(OTHER))]
    samples = []
    for i in range(n):
        t = time.perf_counter()
        subprocess.run(["nft", "-f", "-"], input=scripts[i % 2].encode(), check=True)
        samples.append(time.perf_counter() - t)
    nf.remove(host_if)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=40)
    args = parser.parse_args()
    if shutil.which("nft") is None:
        raise SystemExit("nft is not installed (apt-get install nftables)")
    parent = f"adx-bench-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="adxbench-", dir="/tmp"))
    proc = None
    try:
        bare_raw = subprocess.run(
            [sys.executable, "-c", BARE, str(args.n)], capture_output=True, check=True, text=True
        ).stdout
        bare = summarize(json.loads(bare_raw))
        proc, sock = start_daemon(work, parent)
        progress("creates: none, egress, egress+policy")
        none = summarize(asyncio.run(creates(sock, args.n, "none", network="none")))
        egress = summarize(asyncio.run(creates(sock, args.n, "egress", network="veth")))
        policy = summarize(asyncio.run(creates(sock, args.n, "policy", network_policy=POLICY)))
        progress("policy changes")
        change, get, host_if = asyncio.run(changes(sock, args.n))
        direct = bare_nft(work / "state", "10.213.0.0/16", host_if + "x", args.n)
        emit(
            "netpolicy",
            {
                "baseline_bare_clone3_true": bare,
                "create_network_none": none,
                "create_network_egress": egress,
                "create_network_egress_policy": policy,
                "create_p50_over_baseline": {
                    "none": round(none["p50_ms"] / bare["p50_ms"], 2),
                    "egress": round(egress["p50_ms"] / bare["p50_ms"], 2),
                    "egress_policy": round(policy["p50_ms"] / bare["p50_ms"], 2),
                },
                "policy_change": summarize(change),
                "baseline_nft_f_same_transaction": summarize(direct),
                "baseline_get_round_trip": summarize(get),
                "table": table_name(work / "state"),
            },
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        cleanup_cgroups(parent)
        subprocess.run(["nft", "delete", "table", "inet", table_name(work / "state")], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
