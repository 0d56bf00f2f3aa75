"""Pause and resume of a sandbox with a large writable layer: btrfs snapshots vs the tar copy, same run.

Prints ONE JSON object. For each size in ``--mib`` (default ``64,1024``), a sandbox writes that many MiB of random
data into /work; then, ``--n`` times: *pause* = freeze + checkpoint + delete (what the node's driver does),
*resume to first command* = restore until the restored sandbox's first command has run (it creates a file;
polled on the host every ms).
Two sandboxd daemons on this host, one per mode:
- ``snapshot``: ``disk_quota = "btrfs"``: the layer is a qgroup-limited subvolume, the local checkpoint a
  read-only snapshot (issue 13's goal: pause <= 1 s, resume to first command <= 300 ms);
- ``tar`` (the baseline): the default, a zstd tar of the layer captured and extracted.

``shared_form``: a checkpoint to SHARED storage must be restorable on another node, so it cannot be a pool
snapshot. The portable form is the tar; the other candidate is a btrfs send stream of the read-only snapshot
(zstd-compressed like the tar) received into the other node's pool. Both are timed on the snapshot mode's
first checkpoint of each size: capture (tar+zstd of the upper dir vs ``btrfs send | zstd``) and restore
(``zstd -d | tar -x`` into an empty dir vs ``zstd -d | btrfs receive`` plus the writable snapshot a restore
would take of the received read-only subvolume).

Needs root, cgroups, overlayfs and btrfs-progs. Usage: ``uv run python bench/bench_pause.py [--mib 64,1024 --n 3]``.
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


def _pipe(first: list[str], second: list[str], stdin: Path | None = None, stdout: Path | None = None) -> float:
    """Seconds for ``first | second`` (stdin of first / stdout of second from files), failing loudly."""
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        src = stack.enter_context(open(stdin, "rb")) if stdin else subprocess.DEVNULL
        dst = stack.enter_context(open(stdout, "wb")) if stdout else subprocess.DEVNULL
        a = subprocess.Popen(first, stdin=src, stdout=subprocess.PIPE)
        assert a.stdout is not None
        b = subprocess.Popen(second, stdin=a.stdout, stdout=dst)
        a.stdout.close()
        if b.wait() != 0 or a.wait() != 0:
            raise SystemExit(f"{first} | {second} failed ({a.returncode}, {b.returncode})")
        if stdout:
            os.fsync(dst.fileno())  # type: ignore[union-attr]
    return time.perf_counter() - t0


def shared_forms(work: Path, snapshot: Path) -> dict[str, Any]:
    """The two candidate SHARED forms of one read-only snapshot: capture and restore seconds, bytes."""
    mount = pool_paths(work / "state")[1]
    scratch = work / "shared-scratch"
    scratch.mkdir()
    tar_flags = ["--xattrs", "--xattrs-include=*", "--numeric-owner", "--sparse"]
    zc, zd = ["zstd", "-q", "-1", "-T0", "-c"], ["zstd", "-q", "-d", "-c"]
    tar_file, send_file = scratch / "layer.tar.zst", scratch / "layer.send.zst"
    tar_capture = _pipe(["tar", *tar_flags, "-C", str(snapshot / "upper"), "-cf", "-", "."], zc, stdout=tar_file)
    send_capture = _pipe(["btrfs", "-q", "send", str(snapshot)], zc, stdout=send_file)
    # Cold reads on restore, as on another node: drop the page cache of what was just written.
    subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], check=True)
    (scratch / "x").mkdir()
    t0 = time.perf_counter()
    _pipe(zd, ["tar", *tar_flags, "-C", str(scratch / "x"), "-xpf", "-"], stdin=tar_file)
    subprocess.run(["sync"], check=True)  # both restores end durable (sync counted on both sides)
    tar_restore = time.perf_counter() - t0
    recv = mount / "bench-recv"
    recv.mkdir()
    t0 = time.perf_counter()
    _pipe(zd, ["btrfs", "-q", "receive", str(recv)], stdin=send_file)
    received = recv / snapshot.name
    subprocess.run(["btrfs", "-q", "subvolume", "snapshot", str(received), str(recv / "rw")], check=True)
    subprocess.run(["sync"], check=True)
    send_restore = time.perf_counter() - t0
    for sub in (recv / "rw", received):
        subprocess.run(["btrfs", "-q", "subvolume", "delete", str(sub)], check=True)
    recv.rmdir()
    figures = {
        "tar_zstd": {
            "capture_ms": round(tar_capture * 1e3, 1),
            "restore_ms": round(tar_restore * 1e3, 1),
            "bytes": tar_file.stat().st_size,
        },
        "btrfs_send_zstd": {
            "capture_ms": round(send_capture * 1e3, 1),
            "restore_ms": round(send_restore * 1e3, 1),
            "bytes": send_file.stat().st_size,
        },
    }
    shutil.rmtree(scratch)
    return figures


async def run_mode(work: Path, quota: bool, mib: int, n: int) -> dict[str, Any]:
    parent = f"adx-bench-pause-{uuid.uuid4().hex[:8]}"
    proc, sock = start_daemon(work, parent, quota)
    pauses: list[float] = []
    resumes: list[float] = []
    shared: dict[str, Any] = {}
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
                if quota and i == 0:
                    snap = pool_paths(work / "state")[1] / "ckpt" / ck.checkpoint_id
                    shared = await asyncio.to_thread(shared_forms, work, snap)
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
    result: dict[str, Any] = {"pause": summarize(pauses), "resume_to_first_command": summarize(resumes)}
    if shared:
        result["shared_form"] = shared
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", default="64,1024", help="comma-separated sizes written, MiB")
    ap.add_argument("--n", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(x) for x in args.mib.split(",")]
    base = Path(tempfile.mkdtemp(prefix="adx-bench-pause-", dir="/var/tmp"))
    results: dict[str, Any] = {}
    try:
        for mib in sizes:
            (base / f"snap-{mib}").mkdir()
            (base / f"tar-{mib}").mkdir()
            progress(f"snapshot mode, {mib} MiB written")
            snap = asyncio.run(run_mode(base / f"snap-{mib}", True, mib, args.n))
            progress(f"tar mode (baseline), {mib} MiB written")
            tar = asyncio.run(run_mode(base / f"tar-{mib}", False, mib, args.n))
            shared = snap.pop("shared_form", None)
            ratio = {
                k: round(tar[k]["p50_ms"] / max(snap[k]["p50_ms"], 1e-6), 1)
                for k in ("pause", "resume_to_first_command")
            }
            results[f"{mib}_mib"] = {
                "written_mib": mib,
                "snapshot_btrfs": snap,
                "baseline_tar_copy": tar,
                "speedup_p50": ratio,
                "shared_form": shared,
            }
    finally:
        shutil.rmtree(base, ignore_errors=True)
    emit(
        "sandboxd_pause_resume",
        {**results, "goals": {"pause_p50_ms": 1000, "resume_to_first_command_p50_ms": 300, "at_mib": 1024}},
    )


if __name__ == "__main__":
    main()
