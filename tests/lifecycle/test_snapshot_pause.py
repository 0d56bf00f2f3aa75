"""Pause and resume with snapshot checkpoints on the real stack (issue 13): SDK -> API server -> Coordinator ->
adxlet -> sandboxd with ``disk_quota = "btrfs"`` (local checkpoints are read-only btrfs snapshots, a resume a
writable snapshot) -> execd.

Three cycles keep every file; each checkpoint is a snapshot, and the node's retention (a resumed-from checkpoint
is retired, CRD-9) and the Environment's delete leave no snapshot and no layer subvolume in the pool.
Pause and resume times are printed, not asserted (bench/bench_pause.py measures them).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from apistack import ApiStack
from sbx_helpers import Daemon

import adx
from adx.sandboxd._storage import pool_paths

pytestmark = pytest.mark.skipif(shutil.which("mkfs.btrfs") is None, reason="needs btrfs-progs")


async def eventually(predicate: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


def _entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def _subvolumes(mount: Path) -> str:
    listed = subprocess.run(["btrfs", "subvolume", "list", str(mount)], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.strip()


def _take_down(sandboxds: list[Daemon], mount: Path) -> None:
    """The pool outlives sandboxd by design: the test takes it down (lazily if a sandbox still pins it)."""
    for sandboxd in sandboxds:
        sandboxd.stop()
    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.req("CRD-9", "ENV-3", "SBX-5")
async def test_snapshot_checkpoints_pause_resume_keep_files_and_retire_without_leaks(node_cluster, api_for) -> None:
    nc = await node_cluster(
        capacity={"cpuMillis": 8000, "memoryBytes": 16 * 2**30, "diskBytes": 4 * 2**30},
        sandboxd_config={"disk_quota": "btrfs", "storage_image_bytes": 4 << 30},
    )
    mount = pool_paths(nc.sandboxds["n1"].state_dir)[1]
    try:
        stack: ApiStack = await api_for(nc.cluster)
        key = await stack.tenant("alpha")
        async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
            env = await client.environments.create(
                cpu=0.25, memory="256Mi", disk="512Mi", pause=adx.PausePolicy(retention=adx.Retention.forever())
            )
            await env.files.write("/tmp/acc.txt", b"account 42")
            written = await env.commands.run("head -c 67108864 /dev/urandom > /work/blob && sha256sum /work/blob")
            assert written.exit_code == 0, written
            seen: list[str] = []
            for cycle in range(1, 4):
                t0 = time.perf_counter()
                await env.pause()
                t1 = time.perf_counter()
                assert env.state == "paused" and env.checkpoint is not None
                location = Path(env.checkpoint.location)
                layer = json.loads((location / "manifest.json").read_text())["layer"]
                assert layer["form"] == "btrfs-snapshot" and (mount / "ckpt" / layer["snapshot"]).is_dir()
                seen.append(layer["snapshot"])
                await env.resume()
                again = await env.commands.run("sha256sum /work/blob")
                t2 = time.perf_counter()
                print(f"cycle {cycle}: pause {t1 - t0:.3f}s, resume to first command {t2 - t1:.3f}s")
                assert again.stdout == written.stdout, again
                assert await env.files.read("/tmp/acc.txt") == b"account 42"
            # Retention (CRD-9): every resumed-from checkpoint is retired and deleted: artifact and snapshot.
            await eventually(lambda: not set(seen) & set(_entries(mount / "ckpt")))
            await eventually(lambda: not (location.parent.exists() and _entries(location.parent)))
            await env.delete()
        await eventually(lambda: _entries(mount / "sbx") == [] and _entries(mount / "ckpt") == [])
        assert _subvolumes(mount) == ""
    finally:
        _take_down(list(nc.sandboxds.values()), mount)
