"""Benchmark sandboxd on this host; prints ONE JSON object with every figure next to its same-run baseline.

Figures (targets from issue 3):
- create-to-running p50/p99 over 100 sandboxes (API call until the workload has exec'd in its namespaces,
  cgroup and overlay root, its record and native identity persisted: Running itself is an observation) vs. a
  bare ``clone3`` namespace spawn of ``/bin/true`` from a single-threaded process (same namespaces, no
  cgroup/overlay/registry): p50 <= 25 ms and <= 5x baseline;
- delete p50 (persisted intent, cgroup.kill, empty check, tombstone, reclaim) <= 15 ms;
- checkpoint of a 64 MiB upper layer <= 1 s; restore of it (verify + extract + start) <= 0.5 s;
- create and delete with execd as PID 1 (``CreateRequest.execd``: socket activation, control socket), beside
  the plain create above;
- peer: ``runc run`` of an equivalent bundle (same image via read-only /usr bind, same namespaces).
- user namespaces (issue 13): create p50 with ``user_namespace`` off, on, and on with disk quota and egress
  (``disk_quota = "btrfs"``, ``network = "veth"`` with the default egress policy) vs. the bare ``clone3``
  spawn, each from a fresh daemon in this run: target p50 <= 15 ms and <= 6x the bare spawn.

Needs root, cgroups, overlayfs; runc from ``scripts/install_sandbox_deps.sh`` for the peer figure.
Usage: ``uv run python bench/bench_sandboxd.py [--n 100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from adx.sandboxd import CreateRequest, ExecdOptions, ResourcesSpec, RestoreRequest, SandboxdClient, ref_of
from adx.sandboxd._cgroups import detect_layout

BARE = r"""
import json, os, sys, time
from adx.sandboxd import _linux as lx
flags = lx.CLONE_NEWPID | lx.CLONE_NEWNS | lx.CLONE_NEWUTS | lx.CLONE_NEWIPC | lx.CLONE_NEWNET
out = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    pid = lx.clone3(flags)
    if pid == 0:
        try:
            os.execv("/bin/true", ["/bin/true"])
        finally:
            os._exit(127)
    os.waitpid(pid, 0)
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary_ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(pct(values, 50) * 1000, 2), "p99": round(pct(values, 99) * 1000, 2), "n": len(values)}


def cleanup_cgroups(parent: str) -> None:
    layout = detect_layout()
    roots = ([layout.v2_root] if layout.v2_root else []) + list(dict.fromkeys(layout.v1_mounts.values()))
    if layout.v2_root and (layout.v2_root / parent).is_dir():
        for child in (layout.v2_root / parent).rglob("cgroup.kill"):
            with contextlib.suppress(OSError):
                child.write_text("1")
    time.sleep(0.2)
    for root in roots:
        base = root / parent
        if not base.is_dir():
            continue
        for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()


def start_daemon(work: Path, parent: str, top: str = "", defaults: str = "") -> tuple[subprocess.Popen[bytes], Path]:
    """``top``, ``defaults``: further TOML lines for the top level and the [defaults] table."""
    state = work / "state"
    sock = work / "api" / "s.sock"
    cfg = work / "sandboxd.toml"
    cfg.write_text(
        f'state_dir = "{state}"\nsocket_path = "{sock}"\ncgroup_parent = "{parent}"\n{top}'
        "[capacity]\ncpu_millis = 10000000\nmax_sandboxes = 10000\n"
        f"[defaults]\ncpu_millis = 100\nmemory_bytes = 67108864\n{defaults}"
    )
    log = open(work / "sandboxd.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen([sys.executable, "-m", "adx", "sandboxd", "--config", str(cfg)], stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while True:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(sock))
                break
            except OSError:
                pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"sandboxd did not start: {(work / 'sandboxd.log').read_text()}")
        time.sleep(0.02)
    return proc, sock


def bench_runc(work: Path, image_root: Path, parent: str, n: int) -> dict[str, Any]:
    if not shutil.which("runc"):
        return {"error": "runc not installed (scripts/install_sandbox_deps.sh)"}
    bundle = work / "runc-bundle"
    bundle.mkdir()
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["/bin/true"]
    spec["root"] = {"path": str(image_root), "readonly": True}
    spec["mounts"].append({"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]})
    spec["mounts"].append({"destination": "/work", "type": "tmpfs", "source": "tmpfs", "options": ["size=1m"]})
    spec["hostname"] = "runc"
    root = work / "runc-state"
    times = []
    for i in range(n):
        spec["linux"]["cgroupsPath"] = f"/{parent}/runc-{i}"
        (bundle / "config.json").write_text(json.dumps(spec))
        t = time.perf_counter()
        out = subprocess.run(
            ["runc", "--root", str(root), "run", "--bundle", str(bundle), f"adxbench-{i}"],
            capture_output=True,
            check=False,
        )
        times.append(time.perf_counter() - t)
        if out.returncode != 0:
            return {"error": f"runc run failed: {out.stderr.decode()[-300:]}"}
    return {"run_true_ms": summary_ms(times), "version": subprocess.getoutput("runc --version").splitlines()[0]}


async def bench_daemon(sock: Path, n: int, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with SandboxdClient(sock) as c:
        for i in range(5):  # warm-up (page cache, first spawns) excluded from the figures
            await c.delete(ref_of(await c.create(CreateRequest(request_id=f"warm{i}", argv=["sleep", "1000"]))))
        creates, refs = [], []
        for i in range(n):
            t = time.perf_counter()
            created = await c.create(CreateRequest(request_id=f"c{i}", argv=["sleep", "1000"]))
            creates.append(time.perf_counter() - t)
            refs.append(ref_of(created))
        deletes = []
        for ref in refs:
            t = time.perf_counter()
            await c.delete(ref)
            deletes.append(time.perf_counter() - t)
        out["create_to_running_ms"] = summary_ms(creates)
        out["delete_ms"] = summary_ms(deletes)

        # The same with execd as PID 1 (CreateRequest.execd): + execd runtime mount, the read-only control dir
        # mount, execd's two sockets bound by the supervisor and the hub's control socket. Create then delete
        # one at a time, so no execd start-up competes with the next create for CPU.
        execd_creates, execd_deletes = [], []
        for i in range(n):
            t = time.perf_counter()
            created = await c.create(
                CreateRequest(request_id=f"x{i}", argv=["sleep", "1000"], execd=ExecdOptions(python="/usr/bin/python3"))
            )
            execd_creates.append(time.perf_counter() - t)
            t = time.perf_counter()
            await c.delete(ref_of(created))
            execd_deletes.append(time.perf_counter() - t)
        out["create_to_running_with_execd_pid1_ms"] = summary_ms(execd_creates)
        out["delete_with_execd_pid1_ms"] = summary_ms(execd_deletes)

        blob = "head -c 67108864 /dev/urandom > /work/blob && touch /work/ready && sleep 1000"
        src = await c.create(
            CreateRequest(
                request_id="ck", argv=["/bin/sh", "-c", blob], resources=ResourcesSpec(memory_bytes=256 << 20)
            )
        )
        ready = work / "state" / "sandboxes" / src.sandbox.sandbox_id / "upper" / "work" / "ready"
        deadline = time.monotonic() + 60
        while not ready.exists():
            if time.monotonic() > deadline:
                raise SystemExit("checkpoint source did not write its 64 MiB")
            await asyncio.sleep(0.05)
        t = time.perf_counter()
        ck = await c.checkpoint(ref_of(src))
        out["checkpoint_64mib_s"] = round(time.perf_counter() - t, 3)
        out["checkpoint_artifact_bytes"] = ck.size_bytes
        await c.delete(ref_of(src))
        t = time.perf_counter()
        restored = await c.restore(RestoreRequest(request_id="rs", location=ck.location, digest=ck.digest))
        out["restore_64mib_s"] = round(time.perf_counter() - t, 3)
        await c.delete(ref_of(restored))
    return out


async def bench_creates(sock: Path, n: int) -> dict[str, Any]:
    """Create p50 only (``n`` sandboxes kept running, then deleted), after 5 warm-up creates."""
    async with SandboxdClient(sock) as c:
        for i in range(5):
            await c.delete(ref_of(await c.create(CreateRequest(request_id=f"warm{i}", argv=["sleep", "1000"]))))
        creates, refs = [], []
        for i in range(n):
            t = time.perf_counter()
            created = await c.create(CreateRequest(request_id=f"c{i}", argv=["sleep", "1000"]))
            creates.append(time.perf_counter() - t)
            refs.append(ref_of(created))
        health = await c.health()
        for ref in refs:
            await c.delete(ref)
    return {"create_to_running_ms": summary_ms(creates), "user_namespace": health.user_namespace}


def bench_userns(n: int, bare_p50: float) -> dict[str, Any]:
    """Create p50 with user namespaces off, on, and on with disk quota and egress: a fresh daemon each."""
    variants = {
        # Cold creates (warm_pool = 0): the warm pool's claims are bench_warm.py's.
        "off": ('user_namespace = "off"\nwarm_pool = 0\n', ""),
        "on": ('user_namespace = "on"\nwarm_pool = 0\n', ""),
        "on_quota_egress": ('user_namespace = "on"\ndisk_quota = "btrfs"\nwarm_pool = 0\n', 'network = "veth"\n'),
    }
    out: dict[str, Any] = {}
    for name, (top, defaults) in variants.items():
        parent = f"adx-bench-{uuid.uuid4().hex[:8]}"
        work = Path(tempfile.mkdtemp(prefix="adxbench-", dir="/tmp"))
        proc = None
        try:
            proc, sock = start_daemon(work, parent, top, defaults)
            out[name] = asyncio.run(bench_creates(sock, n))
            out[name]["p50_over_bare_clone3"] = round(out[name]["create_to_running_ms"]["p50"] / bare_p50, 2)
        except SystemExit as exc:
            out[name] = {"error": str(exc)[-500:]}
        finally:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            cleanup_cgroups(parent)
            if "quota" in name:
                subprocess.run(["umount", str(work / "state.storage")], capture_output=True, check=False)
            shutil.rmtree(work, ignore_errors=True)  # the pool's image file lies in it, beside state/
    full = out.get("on_quota_egress", {}).get("create_to_running_ms")
    out["targets"] = {"on_quota_egress_create_p50_ms": 15, "on_quota_egress_over_bare_clone3": 6}
    out["meets_targets"] = None if full is None else full["p50"] <= 15 and full["p50"] <= 6 * bare_p50
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--runc-n", type=int, default=20)
    parser.add_argument("--userns-only", action="store_true", help="only the user namespace figures")
    args = parser.parse_args()
    if args.userns_only:
        bare = summary_ms(
            json.loads(
                subprocess.run(
                    [sys.executable, "-c", BARE, str(args.n)], capture_output=True, check=True, text=True
                ).stdout
            )
        )
        print(json.dumps({"baseline_bare_clone3_true_ms": bare, "user_namespaces": bench_userns(args.n, bare["p50"])}))
        return
    parent = f"adx-bench-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="adxbench-", dir="/tmp"))
    proc = None
    try:
        bare_raw = subprocess.run(
            [sys.executable, "-c", BARE, str(args.n)], capture_output=True, check=True, text=True
        ).stdout
        bare = summary_ms(json.loads(bare_raw))
        proc, sock = start_daemon(work, parent, "warm_pool = 0\n")  # cold creates; bench_warm.py: the pool
        result = asyncio.run(bench_daemon(sock, args.n, work))
        runc = bench_runc(work, work / "state" / "images" / "default" / "root", parent, args.runc_n)
        userns = bench_userns(args.n, bare["p50"])
        create = result["create_to_running_ms"]
        figures = {
            **result,
            "baseline_bare_clone3_true_ms": bare,
            "create_p50_over_baseline_p50": round(create["p50"] / bare["p50"], 2),
            "peer_runc": runc,
            "user_namespaces": userns,
            "targets": {
                "create_p50_ms": 25,
                "create_p50_over_baseline": 5,
                "delete_p50_ms": 15,
                "checkpoint_64mib_s": 1.0,
                "restore_64mib_s": 0.5,
            },
        }
        figures["meets_targets"] = {
            "create_p50": create["p50"] <= 25,
            "create_vs_baseline": create["p50"] <= 5 * bare["p50"],
            "delete_p50": result["delete_ms"]["p50"] <= 15,
            "checkpoint": result["checkpoint_64mib_s"] <= 1.0,
            "restore": result["restore_64mib_s"] <= 0.5,
        }
        figures["host"] = {"cpus": os.cpu_count(), "kernel": os.uname().release}
        print(json.dumps(figures))
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        cleanup_cgroups(parent)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
