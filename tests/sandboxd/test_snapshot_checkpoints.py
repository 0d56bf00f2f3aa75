"""Snapshot checkpoints (issue 13): with ``disk_quota = "btrfs"`` a LOCAL checkpoint is a read-only btrfs snapshot
of the sandbox's subvolume and a restore a writable snapshot of it. What must hold beside the speed:

- a SIGKILL of sandboxd mid-pause (snapshot taken, artifact not yet renamed into place) leaves nothing that is
  listed or restorable as a checkpoint, and the next start deletes the orphan snapshot;
- a SIGKILL mid-resume (the writable snapshot made, before the start; or before the restored record is
  committed) leaves the checkpoint whole and restorable, and no layer subvolume behind once the interrupted
  sandbox is deleted or was never committed;
- deleting checkpoints the way a node's retention and its startup sweep do (ListCheckpoints, then
  DeleteCheckpoint of each) leaves no snapshot, no subvolume and no qgroup in the pool.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from sbx_helpers import Daemon, DaemonFactory, wait_until

from adx.errors import InvalidInputError, UncertainOutcomeError
from adx.sandboxd import CreateRequest, RestoreRequest, SandboxdClient, SandboxRef, State, ref_of
from adx.sandboxd._models import ResourcesSpec
from adx.sandboxd._spawn_client import FAULTS_ENV
from adx.sandboxd._storage import StoragePool, pool_paths

pytestmark = pytest.mark.skipif(shutil.which("mkfs.btrfs") is None, reason="needs btrfs-progs")

MiB = 1 << 20
QUOTA = {"disk_quota": "btrfs", "storage_image_bytes": 4 << 30}
LIMIT = ResourcesSpec(disk_bytes=64 * MiB)
# 8 MiB of data and a marker: the restored layer must carry both (restores run SLEEPER, not this again).
WRITER = ["/bin/sh", "-c", "head -c 8M /dev/urandom > /work/data && echo kept > /work/ready; sleep 1000"]
SLEEPER = ["sleep", "1000"]


def _pool(d: Daemon) -> Path:
    return pool_paths(d.state_dir)[1]


def _upper(d: Daemon, sandbox_id: str) -> Path:
    return _pool(d) / "sbx" / sandbox_id / "upper"


def _snapshots(d: Daemon) -> list[str]:
    root = _pool(d) / "ckpt"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def _local_root(d: Daemon) -> Path:
    return d.state_dir / "checkpoints"


def _subvolumes(d: Daemon) -> list[str]:
    listed = subprocess.run(["btrfs", "subvolume", "list", str(_pool(d))], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    return sorted(line.rsplit(" path ", 1)[1] for line in listed.stdout.splitlines() if " path " in line)


def _qgroup_ids(d: Daemon) -> list[str]:
    out = subprocess.run(["btrfs", "qgroup", "show", str(_pool(d))], capture_output=True, text=True, check=True)
    return sorted(line.split()[0] for line in out.stdout.splitlines() if line.startswith("0/"))


def _qgroups(d: Daemon) -> list[str]:
    """The level-0 qgroups of the pool once every deleted subvolume is dropped (the kernel then removes its
    qgroup, within a moment; one left for good would be a leak)."""
    subprocess.run(["btrfs", "subvolume", "sync", str(_pool(d))], check=True, capture_output=True)
    deadline = time.monotonic() + 5
    while (ids := _qgroup_ids(d)) != ["0/5"] and time.monotonic() < deadline:
        time.sleep(0.1)
    return ids


async def _written(d: Daemon, c: SandboxdClient) -> SandboxRef:
    ref = ref_of(await c.create(CreateRequest(request_id="w", argv=WRITER, resources=LIMIT)))
    wait_until(lambda: (_upper(d, ref.sandbox_id) / "work/ready").exists(), timeout=30)
    return ref


def _killed(d: Daemon) -> None:
    assert d.proc is not None and d.proc.wait(10) == -9  # the fault point SIGKILLed it


@pytest.mark.req("SBX-10", "SBX-11", "SBX-5")
@pytest.mark.parametrize("point", ["checkpoint.after_snapshot", "checkpoint.before_rename"])
async def test_sigkill_mid_snapshot_pause_leaves_no_checkpoint_taken_as_whole(
    quota_sandboxd: DaemonFactory, point: str
) -> None:
    d = quota_sandboxd(start=False, **QUOTA)
    d.start(env={FAULTS_ENV: point})
    async with d.client() as c:
        ref = await _written(d, c)
        assert (await c.pause(ref)).state == State.PAUSED
        with pytest.raises(UncertainOutcomeError):
            await c.checkpoint(ref, leave_running=True)
    _killed(d)
    # The kill came with the snapshot taken: what a crash leaves is a snapshot and at most a staging dir.
    [orphan] = _snapshots(d)
    assert [p.name for p in _local_root(d).iterdir() if not p.name.startswith(".")] == []

    d.start()
    async with d.client() as c:
        assert (await c.list_checkpoints("local")).checkpoints == []  # nothing half-made is listed
        assert _snapshots(d) == [] and list(_local_root(d).iterdir()) == []  # the orphan was deleted
        assert f"ckpt/{orphan}" not in _subvolumes(d)
        # The acknowledged pause stands, and a checkpoint now is whole and restores the layer.
        assert (await c.get(ref)).state == State.PAUSED
        ck = await c.checkpoint(ref, leave_running=True)
        await c.delete(ref)
        restored = ref_of(
            await c.restore(RestoreRequest(request_id="r", location=ck.location, digest=ck.digest, argv=SLEEPER))
        )
        assert (_upper(d, restored.sandbox_id) / "work/ready").read_text() == "kept\n"
        assert (_upper(d, restored.sandbox_id) / "work/data").stat().st_size == 8 * MiB
        await c.delete(restored)
        await c.delete_checkpoint(ck.location, ck.digest)
    assert _subvolumes(d) == [] and _qgroups(d) == ["0/5"]


@pytest.mark.req("SBX-10", "SBX-13", "SBX-5")
async def test_sigkill_mid_snapshot_resume_keeps_the_checkpoint_and_leaks_no_layer(
    quota_sandboxd: DaemonFactory,
) -> None:
    # Killed with the writable snapshot in place and the record committed as creating, before the start: the
    # restart settles it failed (reserved); its delete removes its subvolume; the read-only checkpoint
    # snapshot is untouched (same UUID) and restores again.
    d = quota_sandboxd(**QUOTA)
    async with d.client() as c:
        ref = await _written(d, c)
        await c.pause(ref)
        ck = await c.checkpoint(ref, leave_running=True)
        await c.delete(ref)
    manifest = json.loads((Path(ck.location) / "manifest.json").read_text())
    assert manifest["layer"]["form"] == "btrfs-snapshot"  # the format says which kind it is
    d.kill()
    d.start(env={FAULTS_ENV: "restore.after_extract"})
    request = RestoreRequest(
        request_id="r1", location=ck.location, digest=ck.digest, sandbox_id="restored", token="t" * 40, argv=SLEEPER
    )
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError):
            await c.restore(request)
    _killed(d)
    assert (_upper(d, "restored") / "work/ready").exists()  # the kill came after the writable snapshot

    d.start()
    async with d.client() as c:
        again = await c.restore(request)  # the retry returns the interrupted one: never a second start
        assert again.sandbox.state == State.FAILED and "interrupted" in (again.sandbox.reason or "")
        await c.delete(ref_of(again))
        assert not (_pool(d) / "sbx" / "restored").exists()
        fresh = ref_of(
            await c.restore(RestoreRequest(request_id="r2", location=ck.location, digest=ck.digest, argv=SLEEPER))
        )
        assert (_upper(d, fresh.sandbox_id) / "work/ready").read_text() == "kept\n"
        await c.delete(fresh)
        await c.delete_checkpoint(ck.location, ck.digest)
    assert _subvolumes(d) == [] and _qgroups(d) == ["0/5"]


@pytest.mark.req("SBX-10", "SBX-5")
async def test_sigkill_before_a_restored_record_is_committed_leaves_no_layer_subvolume(
    quota_sandboxd: DaemonFactory,
) -> None:
    # The writable snapshot is made while the record's commit runs beside it: a kill before the commit leaves
    # an ID nobody holds a record of (blocked for good), whose layer subvolume only the next start can remove.
    d = quota_sandboxd(**QUOTA)
    async with d.client() as c:
        ref = await _written(d, c)
        await c.pause(ref)
        ck = await c.checkpoint(ref, leave_running=True)
        await c.delete(ref)
    d.kill()
    d.start(env={FAULTS_ENV: "create.before_commit"})
    request = RestoreRequest(request_id="r1", location=ck.location, digest=ck.digest, sandbox_id="lost", argv=SLEEPER)
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError):
            await c.restore(request)
    _killed(d)
    assert (_pool(d) / "sbx" / "lost").exists()  # the layer was made before the kill

    d.start()
    assert not (_pool(d) / "sbx" / "lost").exists()
    async with d.client() as c:
        fresh = ref_of(
            await c.restore(RestoreRequest(request_id="r2", location=ck.location, digest=ck.digest, argv=SLEEPER))
        )
        assert (_upper(d, fresh.sandbox_id) / "work/ready").read_text() == "kept\n"
        await c.delete(fresh)
        await c.delete_checkpoint(ck.location, ck.digest)
    assert _subvolumes(d) == [] and _qgroups(d) == ["0/5"]


@pytest.mark.req("SBX-5")
async def test_retention_and_the_startup_sweep_delete_snapshot_checkpoints_without_leaks(
    quota_sandboxd: DaemonFactory,
) -> None:
    # A node deletes a superseded checkpoint (retention) and, at its start, every listed one no Environment
    # references (the sweep): both are DeleteCheckpoint of what ListCheckpoints reports.
    d = quota_sandboxd(**QUOTA)
    async with d.client() as c:
        ref = await _written(d, c)
        taken = []
        for _ in range(3):
            await c.pause(ref)
            taken.append(await c.checkpoint(ref, leave_running=True))
            await c.resume(ref)
        listed = (await c.list_checkpoints("local")).checkpoints
        assert sorted(s.checkpoint_id for s in listed) == sorted(t.checkpoint_id for t in taken)
        # The layer's size (its qgroup's referenced bytes), though no bytes were copied or walked.
        assert all(8 * MiB <= s.size_bytes < 9 * MiB for s in listed), listed
        assert _snapshots(d) == sorted(t.checkpoint_id for t in taken)
        # That size is read from the snapshot's qgroup (sysfs), not measured by walking its files.
        pool = StoragePool(*pool_paths(d.state_dir), 0)
        probe = pool.snapshot(ref.sandbox_id, "probe")
        pool.delete_snapshot("probe")
        assert probe.size_bytes is not None and 8 * MiB <= probe.size_bytes < 9 * MiB, probe
        # Retention: the oldest goes as soon as a newer one exists.
        await c.delete_checkpoint(taken[0].location, taken[0].digest)
        assert _snapshots(d) == sorted(t.checkpoint_id for t in taken[1:])
        await c.delete(ref)
    d.kill()  # the node's sweep runs after a restart of either side
    d.start()
    async with d.client() as c:
        for stored in (await c.list_checkpoints("local")).checkpoints:
            await c.delete_checkpoint(stored.location, stored.digest)
        assert (await c.list_checkpoints("local")).checkpoints == []
    assert _snapshots(d) == [] and list(_local_root(d).iterdir()) == []
    assert _subvolumes(d) == [] and _qgroups(d) == ["0/5"]


@pytest.mark.req("SBX-5")
async def test_a_manifest_of_an_unknown_layer_form_is_refused_naming_the_field(sandboxd: DaemonFactory) -> None:
    # The manifest says which form its layer has; a form this daemon does not know is refused before anything
    # is made, even when the digest matches (a manifest from a newer sandboxd).
    d = sandboxd()
    async with d.client() as c:
        ref = ref_of(await c.create(CreateRequest(request_id="c", argv=SLEEPER)))
        await c.pause(ref)
        ck = await c.checkpoint(ref)
        manifest_path = Path(ck.location) / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        assert manifest["layer"]["form"] == "tar"  # no pool: the portable form
        manifest["layer"]["form"] = "zfs-clone"
        raw = json.dumps(manifest).encode()
        manifest_path.write_bytes(raw)
        digest = hashlib.sha256(raw).hexdigest()
        with pytest.raises(InvalidInputError, match="zfs-clone") as refused:
            await c.restore(RestoreRequest(request_id="r", location=ck.location, digest=digest, argv=SLEEPER))
        assert refused.value.field == "manifest.layer.form"
        assert (await c.resource()).reserved.memory_bytes == (await c.get(ref)).resources.memory_bytes
