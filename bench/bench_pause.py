"""Pause and resume of a sandbox with a large writable layer: btrfs snapshots vs the tar copy, same run.

Prints ONE JSON object. A sandbox writes ``--mib`` MiB of random data (default 1024) into /work; then, ``--n``
times: *pause* = freeze + checkpoint + delete (what the node's driver does), *resume to first command* =
restore until the restored sandbox's first command has run (it creates a file; polled on the host every ms).
Two sandboxd daemons on this host, one per mode:
- ``snapshot``: ``disk_quota = "btrfs"``: the layer is a qgroup-limited subvolume, the local checkpoint a
  read-only snapshot (issue 13's goal: pause <= 1 s, resume to first command <= 300 ms);
- ``tar`` (the baseline): the default, a zstd tar of the layer captured and extracted.

Needs root, cgroups, overlayfs and btrfs-progs. Usage: ``uv run python bench/bench_pause.py [--mib 1024 --n 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from _harness import emit, progress, summarize
from bench_sandboxd import cleanup_cgroups

from adx.sandboxd import CreateRequest, ResourcesSpec, RestoreRequest, SandboxdClient, SandboxRef, ref_of
from adx.sandboxd._storage import StoragePool, pool_paths


def start_daemon(
    work: Path, parent: str, quota: bool, images_dir: Path | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    state = work / "state"
    sock = work / "api" / "s.sock"
    cfg = work / "sandboxd.toml"
    extra = 'disk_quota = "btrfs"\nstorage_image_bytes = 17179869184\n' if quota else ""
    if images_dir is not None:
        extra += f'images_dir = "{images_dir}"\n'
    cfg.write_text(
        f'state_dir = "{state}"\nsocket_path = "{sock}"\ncgroup_parent = "{parent}"\n{extra}'
        "checkpoint_timeout_seconds = 600\n"
        "[defaults]\ncpu_millis = 1000\nmemory_bytes = 268435456\n"
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


def upper(work: Path, quota: bool, sandbox_id: str) -> Path:
    if quota:
        return pool_paths(work / "state")[1] / "sbx" / sandbox_id / "upper"
    return work / "state" / "sandboxes" / sandbox_id / "upper"


async def wait_file(path: Path, limit_s: float = 600.0) -> None:
    deadline = time.monotonic() + limit_s
    while not await asyncio.to_thread(path.exists):
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear within {limit_s}s")
        await asyncio.sleep(0.001)


async def run_mode(work: Path, quota: bool, mib: int, n: int) -> dict[str, Any]:
    parent = f"adx-bench-pause-{uuid.uuid4().hex[:8]}"
    proc, sock = start_daemon(work, parent, quota)
    pauses: list[float] = []
    resumes: list[float] = []
    try:
        async with SandboxdClient(sock, timeout=600.0) as c:
            disk = ResourcesSpec(disk_bytes=(mib + 512) << 20)
            argv = ["/bin/sh", "-c", f"head -c {mib}M /dev/urandom > /work/data && touch /work/ready; sleep 100000"]
            ref: SandboxRef = ref_of(await c.create(CreateRequest(request_id="w", argv=argv, resources=disk)))
            await wait_file(upper(work, quota, ref.sandbox_id) / "work/ready")
            for i in range(n):
                t0 = time.perf_counter()
                await c.pause(ref)
                ck = await c.checkpoint(ref, leave_running=True)
                await c.delete(ref)
                pauses.append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                first = ["/bin/sh", "-c", f"touch /work/first-{i}; sleep 100000"]
                restored = await c.restore(
                    RestoreRequest(request_id=f"r{i}", location=ck.location, digest=ck.digest, argv=first)
                )
                ref = ref_of(restored)
                await wait_file(upper(work, quota, ref.sandbox_id) / f"work/first-{i}")
                resumes.append(time.perf_counter() - t1)
                size = os.stat(upper(work, quota, ref.sandbox_id) / "work/data").st_size
                if size != mib << 20:
                    raise SystemExit(f"restored layer lost data: {size} bytes")
                await c.delete_checkpoint(ck.location, ck.digest)
                progress(
                    f"{'snapshot' if quota else 'tar'} cycle {i}: pause {pauses[-1]:.3f}s resume {resumes[-1]:.3f}s"
                )
            await c.delete(ref)
    finally:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        cleanup_cgroups(parent)
        if quota:
            image, mount = pool_paths(work / "state")
            StoragePool(image, mount, 0).unmount()
    return {"pause": summarize(pauses), "resume_to_first_command": summarize(resumes)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--n", type=int, default=5)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="adx-bench-pause-", dir="/var/tmp"))
    try:
        (base / "snap").mkdir()
        (base / "tar").mkdir()
        progress(f"snapshot mode, {args.mib} MiB written")
        snap = asyncio.run(run_mode(base / "snap", True, args.mib, args.n))
        progress(f"tar mode (baseline), {args.mib} MiB written")
        tar = asyncio.run(run_mode(base / "tar", False, args.mib, args.n))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ratio = {k: round(tar[k]["p50_ms"] / max(snap[k]["p50_ms"], 1e-6), 1) for k in ("pause", "resume_to_first_command")}
    emit(
        "sandboxd_pause_resume",
        {
            "written_mib": args.mib,
            "snapshot_btrfs": snap,
            "baseline_tar_copy": tar,
            "speedup_p50": ratio,
            "goals": {"pause_p50_ms": 1000, "resume_to_first_command_p50_ms": 300},
        },
    )


if __name__ == "__main__":
    main()
