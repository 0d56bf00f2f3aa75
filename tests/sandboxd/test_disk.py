# ruff: noqa: ASYNC240 - the tests inspect host files between awaits; a blocking stat in a test is harmless
"""Enforced disk (issue 13): with ``disk_quota = "btrfs"`` a sandbox's writable layer is a btrfs subvolume of a
loop-mounted image sandboxd owns, limited to the sandbox's ``disk`` request by a qgroup.

The kernel fails a write past a qgroup limit with EDQUOT ("Disk quota exceeded"), not ENOSPC; the tests assert
what really happens. Every test unmounts the pool it made (the mount outlives sandboxd by design).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sbx_helpers import Daemon, DaemonFactory, wait_until

from adx.sandboxd import CreateRequest, RestoreRequest, SandboxdClient, SandboxRef, ref_of
from adx.sandboxd._models import ResourcesSpec
from adx.sandboxd._storage import pool_paths

pytestmark = pytest.mark.skipif(shutil.which("mkfs.btrfs") is None, reason="needs btrfs-progs")

MiB = 1 << 20
QUOTA = {"disk_quota": "btrfs", "storage_image_bytes": 4 << 30}


def _upper(d: Daemon, sandbox_id: str) -> Path:
    return pool_paths(d.state_dir)[1] / "sbx" / sandbox_id / "upper"


def _writer(mib: int) -> list[str]:
    """Write ``mib`` MiB into /work; report dd's outcome, the size written and ``df``, then stay up.

    The report is written after ``big`` is removed: at the limit even a new file's metadata is refused."""
    return [
        "/bin/sh",
        "-c",
        f"out=$(dd if=/dev/zero of=/work/big bs=1M count={mib} conv=fsync 2>&1); rc=$?; "
        "size=$(stat -c %s /work/big); rm -f /work/big; "
        'printf "%s\\nrc=%s\\nsize=%s\\n" "$out" "$rc" "$size" > /work/report.tmp; df -B1 /work >> /work/report.tmp; '
        "mv /work/report.tmp /work/report; sleep 1000",
    ]


def _field(report: str, name: str) -> int:
    return int(next(line for line in report.splitlines() if line.startswith(f"{name}="))[len(name) + 1 :])


@pytest.mark.req("SEC-3", "SBX-12")
async def test_write_past_disk_fails_and_neighbour_is_unaffected(quota_sandboxd: DaemonFactory) -> None:
    d = quota_sandboxd(**QUOTA)
    async with d.client() as c:
        greedy = ref_of(
            await c.create(
                CreateRequest(request_id="g", argv=_writer(96), resources=ResourcesSpec(disk_bytes=32 * MiB))
            )
        )
        modest = ref_of(
            await c.create(
                CreateRequest(request_id="m", argv=_writer(24), resources=ResourcesSpec(disk_bytes=32 * MiB))
            )
        )
        g_report = wait_until(lambda: (_upper(d, greedy.sandbox_id) / "work/report").exists(), timeout=30)
        assert g_report
        report = (_upper(d, greedy.sandbox_id) / "work/report").read_text()
        # EDQUOT, errno 122: what btrfs qgroups return; the write stops at the limit.
        assert "Disk quota exceeded" in report and _field(report, "rc") == 1, report
        assert 16 * MiB < _field(report, "size") <= 32 * MiB, report
        wait_until(lambda: (_upper(d, modest.sandbox_id) / "work/report").exists(), timeout=30)
        neighbour = (_upper(d, modest.sandbox_id) / "work/report").read_text()
        assert _field(neighbour, "rc") == 0 and _field(neighbour, "size") == 24 * MiB, neighbour
        # Delete reclaims the subvolume (its bytes leave the pool).
        await c.delete(greedy)
        wait_until(lambda: not _upper(d, greedy.sandbox_id).parent.exists())


DIRS = ("/tmp", "/var/tmp", "/work", "/root")


def _cycle(cycle: int) -> list[str]:
    reads = " ".join(f"{x}/c{i}.txt" for i in range(1, cycle) for x in DIRS)
    check = f"cat {reads} > /work/seen-{cycle}.tmp 2>&1; " if reads else f": > /work/seen-{cycle}.tmp; "
    writes = " && ".join(f"echo 'cycle {cycle} in {x}' > {x}/c{cycle}.txt" for x in DIRS)
    return [
        "/bin/sh",
        "-c",
        f"{check}mv /work/seen-{cycle}.tmp /work/seen-{cycle}.txt; {writes} && touch /work/ready-{cycle}; sleep 1000",
    ]


def _expected(cycle: int) -> str:
    return "".join(f"cycle {i} in {x}\n" for i in range(1, cycle) for x in DIRS)


async def _pause(c: SandboxdClient, ref: SandboxRef) -> tuple[str, str]:
    await c.pause(ref)
    ck = await c.checkpoint(ref, leave_running=True)
    await c.delete(ref)
    return ck.location, ck.digest


@pytest.mark.req("SBX-5")
async def test_quota_layer_survives_three_pause_cycles_and_a_restart(quota_sandboxd: DaemonFactory) -> None:
    d = quota_sandboxd(**QUOTA)
    limit = ResourcesSpec(disk_bytes=64 * MiB)
    snapshots: list[tuple[str, str, str]] = []
    async with d.client() as c:
        ref = ref_of(await c.create(CreateRequest(request_id="c1", argv=_cycle(1), resources=limit)))
        wait_until(lambda: (_upper(d, ref.sandbox_id) / "work/ready-1").exists())
    for cycle in range(2, 5):
        if cycle == 3:
            d.kill()  # sandboxd restarts between cycles: it adopts its mounted pool
            d.start()
        async with d.client() as c:
            location, digest = await _pause(c, ref)
            # The local checkpoint is a read-only snapshot in the pool (metadata), not a tar of the layer.
            manifest = json.loads((Path(location) / "manifest.json").read_text())
            assert manifest["layer"]["compression"] == "btrfs-snapshot"
            assert sorted(p.name for p in Path(location).iterdir()) == ["manifest.json"]
            snapshots.append((location, digest, manifest["layer"]["snapshot"]))
            prev = ref.sandbox_id
            wait_until(lambda prev=prev: not _upper(d, prev).exists())  # type: ignore[misc]
            ref = ref_of(
                await c.restore(
                    RestoreRequest(request_id=f"r{cycle}", location=location, digest=digest, argv=_cycle(cycle))
                )
            )
            sid = ref.sandbox_id
            wait_until(lambda sid=sid, cycle=cycle: (_upper(d, sid) / f"work/ready-{cycle}").exists())  # type: ignore[misc]
            assert (_upper(d, sid) / f"work/seen-{cycle}.txt").read_text() == _expected(cycle)
    # Deleting a checkpoint deletes its snapshot.
    ckpt_dir = pool_paths(d.state_dir)[1] / "ckpt"
    async with d.client() as c:
        location, digest, name = snapshots[0]
        assert (ckpt_dir / name).exists()
        await c.delete_checkpoint(location, digest)
        assert not (ckpt_dir / name).exists() and not Path(location).exists()
    # A snapshot no artifact names (a crash between snapshot and manifest) is swept at the next start.
    location, digest, name = snapshots[1]
    d.kill()
    shutil.rmtree(location)
    d.start()
    assert not (ckpt_dir / name).exists() and (ckpt_dir / snapshots[2][2]).exists()
    # The pool image lies beside the state dir, never inside it (nothing that walks the state dir reads it).
    image, mount = pool_paths(d.state_dir)
    assert image.exists() and not image.is_relative_to(d.state_dir) and not mount.is_relative_to(d.state_dir)


@pytest.mark.req("SBX-5")
async def test_shared_root_checkpoint_is_a_tar_restored_into_a_limited_layer(
    quota_sandboxd: DaemonFactory, tmp_path: Path
) -> None:
    """A checkpoint into a shared root must be restorable anywhere: a tar of the layer, never a pool snapshot;
    its restore extracts into a fresh subvolume that carries the new sandbox's limit."""
    shared = tmp_path / "shared"
    d = quota_sandboxd(checkpoint_dirs={"shared": str(shared)}, **QUOTA)
    async with d.client() as c:
        argv = ["/bin/sh", "-c", "echo kept > /tmp/k.txt && touch /work/ready; sleep 1000"]
        ref = ref_of(
            await c.create(CreateRequest(request_id="c", argv=argv, resources=ResourcesSpec(disk_bytes=32 * MiB)))
        )
        wait_until(lambda: (_upper(d, ref.sandbox_id) / "work/ready").exists())
        await c.pause(ref)
        ck = await c.checkpoint(ref, storage="shared", leave_running=True)
        await c.delete(ref)
        manifest = json.loads((Path(ck.location) / "manifest.json").read_text())
        assert manifest["layer"]["form"] == "tar" and manifest["layer"]["compression"] in ("zstd", "gzip")
        restored = ref_of(
            await c.restore(RestoreRequest(request_id="r", location=ck.location, digest=ck.digest, argv=_writer(48)))
        )
        wait_until(lambda: (_upper(d, restored.sandbox_id) / "work/report").exists(), timeout=30)
        assert (_upper(d, restored.sandbox_id) / "tmp/k.txt").read_text() == "kept\n"
        report = (_upper(d, restored.sandbox_id) / "work/report").read_text()
        assert "Disk quota exceeded" in report and _field(report, "size") <= 32 * MiB, report


@pytest.mark.req("RES-6", "SBX-12")
async def test_a_sandbox_that_reserves_no_disk_is_limited_by_the_default(quota_sandboxd: DaemonFactory) -> None:
    """``disk_bytes = 0`` (an Environment that asked no disk: the node sends what placement reserved) reserves no
    disk, yet its layer still gets a quota: ``defaults.disk_bytes`` as a limit (it was refused: "must be positive
    when disk quotas are on")."""
    d = quota_sandboxd(**QUOTA, defaults={"disk_bytes": 32 * MiB})
    async with d.client() as c:
        ref = ref_of(
            await c.create(CreateRequest(request_id="z", argv=_writer(48), resources=ResourcesSpec(disk_bytes=0)))
        )
        assert (await c.resource()).reserved.disk_bytes == 0
        assert wait_until(lambda: (_upper(d, ref.sandbox_id) / "work/report").exists(), timeout=30)
        report = (_upper(d, ref.sandbox_id) / "work/report").read_text()
        assert "Disk quota exceeded" in report and _field(report, "rc") == 1, report
        assert 16 * MiB < _field(report, "size") <= 32 * MiB, report
