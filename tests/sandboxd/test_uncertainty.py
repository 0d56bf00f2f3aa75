"""SBX-13 uncertainty handling, SBX-7 late-start prevention, TTL maintenance and the config error path."""
# ruff: noqa: ASYNC221 - chattr is a millisecond helper run between awaits; blocking is harmless in a test

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbx_helpers import LAYOUT, Daemon, DaemonFactory, cleanup_cgroup_parent, wait_until

from adx.errors import ConflictError, NotFoundError, UnavailableError, UncertainOutcomeError
from adx.sandboxd import CreateRequest, State, ref_of
from adx.sandboxd._image import ensure_default_image, load_image
from adx.sandboxd._spawn_client import SpawnerProcess
from adx.sandboxd._spawn_spec import Limits, SpawnSpec


@pytest.fixture
def immutable() -> Iterator[list[Path]]:
    """Paths made immutable (chattr +i) by a test; always made mutable again."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        subprocess.run(["chattr", "-i", str(path)], check=False)


@pytest.mark.req("SBX-13", "SBX-2")
async def test_uncertain_registry_commit_sets_storage_failed_until_restart(
    sandboxd: DaemonFactory, immutable: list[Path]
) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="a", argv=["sleep", "1000"]))
        sid = created.sandbox.sandbox_id
        sdir = d.sandbox_dir(sid)
        # The storage fails under sandboxd: even root cannot create the temp file for the next commit.
        subprocess.run(["chattr", "+i", str(sdir)], check=True)
        immutable.append(sdir)
        with pytest.raises(UncertainOutcomeError, match="registry access is refused"):
            await c.delete(ref_of(created))
        with pytest.raises(UnavailableError, match="storage failed"):
            await c.list()
        with pytest.raises(UnavailableError, match="storage failed"):
            await c.create(CreateRequest(request_id="b", argv=["true"]))
        health = await c.health()
        assert health.storage_failed and not health.ok
        # Nothing was killed: the delete never reached the native side without its persisted intent.
        assert d.cgroup_procs(sid)
    subprocess.run(["chattr", "-i", str(sdir)], check=True)
    d.kill()
    d.start()  # restart re-reads the disk and reconciles
    async with d.client() as c:
        assert (await c.health()).ok
        assert (await c.get(ref_of(created))).state == State.RUNNING
        await c.delete(ref_of(created))


@pytest.mark.req("SBX-13")
async def test_failed_create_with_confirmed_cleanup_removes_record_and_reservation(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        with pytest.raises(UnavailableError, match="failed to start") as info:
            await c.create(CreateRequest(request_id="bad", argv=["/no/such/binary"]))
        sid = info.value.details["sandbox_id"]
        assert await c.list() == []
        assert (await c.resource()).reserved.memory_bytes == 0
        assert (d.sandbox_dir(sid) / "tombstone.json").exists()
        assert not d.v2_cgroup(sid).exists()
        # The request ID is free again (the failed sandbox is gone), its sandbox ID is not reused.
        ok = await c.create(CreateRequest(request_id="bad", argv=["sleep", "1000"]))
        assert ok.sandbox.sandbox_id != sid
        await c.delete(ref_of(ok))


@pytest.mark.req("SBX-7", "SBX-5")
async def test_supervisor_refuses_to_start_under_a_delete_intent_or_a_second_time(tmp_path: Path) -> None:
    parent = f"adx-test-late-{os.getpid()}"
    image = ensure_default_image(tmp_path / "images")
    spawner = SpawnerProcess()
    spawner.start()
    await spawner.attach()
    try:
        for name, state, started_before in (("late", "stopping", False), ("again", "creating", True)):
            sdir = tmp_path / name
            for sub in ("", "upper", "ovlwork", "rootfs", "run"):
                (sdir / sub).mkdir()
            (sdir / "record.json").write_text(json.dumps({"format": 2, "owner": "o", "record": {"state": state}}))
            if started_before:
                (sdir / "native.json").write_text("{}")
            spec = SpawnSpec(
                sandbox_id=name,
                sandbox_dir=str(sdir),
                image_root=str(image / "root"),
                image_binds=load_image(image)["binds"],
                init_argv=["sleep", "1000"],
                env={"PATH": "/usr/bin:/bin"},
                cwd="/work",
                hostname=name,
                network="none",
                cgroup_parent=parent,
                resources=Limits(cpu_millis=100, memory_bytes=64 << 20, pids_max=64),
                log_dir=str(sdir / "logs"),
                log_segment_bytes=1 << 20,
                log_max_bytes=4 << 20,
                run_dir=str(sdir / "run"),
            )
            report = await spawner.spawn(spec, 20.0)
            assert report["ok"] is False
            assert ("delete intent" if state == "stopping" else "never restarted") in report["error"]
            assert LAYOUT.v2_root is not None and not (LAYOUT.v2_root / parent / name).exists()
            assert not (sdir / "exit.json").exists()
    finally:
        await spawner.close()
        cleanup_cgroup_parent(parent)


@pytest.mark.req("SBX-10")
async def test_expired_sandbox_is_deleted_by_maintenance(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="ttl", argv=["sleep", "1000"], ttl_seconds=0.5))
        sid = created.sandbox.sandbox_id
        wait_until(lambda: (d.sandbox_dir(sid) / "tombstone.json").exists(), timeout=10)
        with pytest.raises(NotFoundError):
            await c.get(ref_of(created))
        assert not d.v2_cgroup(sid).exists()
        # A long wait that times out says so instead of inventing an exit.
        other = await c.create(CreateRequest(request_id="w", argv=["sleep", "1000"]))
        waited = await c.wait(ref_of(other), timeout_seconds=0.3)
        assert not waited.done and waited.sandbox.state == State.RUNNING
        await c.delete(ref_of(other))


def test_config_error_exits_at_once_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "s"}"\n[defaults]\nmemory_byte = 5\n')
    out = subprocess.run(
        [sys.executable, "-m", "adx", "sandboxd", "--config", str(cfg)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2, out.stderr
    assert "defaults.memory_byte" in out.stderr and "unknown key" in out.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.req("SBX-13", "SBX-7")
async def test_uncertain_cleanup_keeps_failed_record_and_failed_delete_keeps_stopping(sandboxd: DaemonFactory) -> None:
    d = sandboxd(start=False)
    d.start(env={"ADX_SANDBOXD_FAULTS": "delete.native:fail"})  # the native runtime cannot clean up
    async with d.client() as c:
        running = await c.create(CreateRequest(request_id="ok", argv=["sleep", "1000"]))
        with pytest.raises(UncertainOutcomeError, match="cleanup is uncertain") as info:
            await c.create(CreateRequest(request_id="bad", argv=["/no/such/binary"]))
        bad_id = info.value.details["sandbox_id"]  # the ID is in the error
        listed = {s.sandbox_id: s for s in await c.list()}
        assert listed[bad_id].state == State.FAILED  # kept as failed, full reservation kept
        with pytest.raises(UnavailableError, match="injected"):
            await c.delete(ref_of(running))
        info_after = await c.get(ref_of(running))  # token and record kept; the intent stays
        assert info_after.state == State.STOPPING
        assert d.cgroup_procs(running.sandbox.sandbox_id), "nothing was claimed or killed"
        reserved = (await c.resource()).reserved.memory_bytes
        assert reserved == running.sandbox.resources.memory_bytes + listed[bad_id].resources.memory_bytes
    d.kill()
    d.start()  # runtime access restored: startup retries the Stopping record
    async with d.client() as c:
        with pytest.raises(NotFoundError):
            await c.get(ref_of(running))
        [left] = await c.list()
        assert left.sandbox_id == bad_id and left.state == State.FAILED  # only an explicit delete removes it
        assert (await c.resource()).reserved.memory_bytes == left.resources.memory_bytes
        # Retrying the same request returns that failed sandbox (with its token) instead of starting another.
        again = await c.create(CreateRequest(request_id="bad", argv=["/no/such/binary"]))
        assert again.sandbox.sandbox_id == bad_id and again.sandbox.state == State.FAILED
        await c.delete(ref_of(again))
        assert await c.list() == [] and (await c.resource()).reserved.memory_bytes == 0


@pytest.mark.req("SEC-3")
def test_image_init_builds_the_default_image_without_host_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "sandboxd.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "s"}"\n')
    out = subprocess.run(
        [sys.executable, "-m", "adx", "image", "init", "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    root = Path(out.stdout.strip()) / "root"
    assert (root / "etc/passwd").exists() and (root / "work").is_dir()
    for secret in ("etc/shadow", "etc/gshadow", "etc/ssh", "etc/sudoers", "etc/ssl/private"):
        assert not (root / secret).exists(), secret
    assert list((root / "root").iterdir()) == [] and list((root / "usr").iterdir()) == []


@pytest.mark.req("SBX-6", "SBX-13")
async def test_losing_the_spawner_mid_create_is_uncertain_not_missing(sandboxd: DaemonFactory) -> None:
    d = sandboxd(start=False)
    d.start(env={"ADX_SANDBOXD_FAULTS": "spawner.after_handoff"})  # the spawner dies right after handing off
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError, match="uncertain") as info:
            await c.create(CreateRequest(request_id="u", argv=["sleep", "1000"]))
        sid = info.value.details["sandbox_id"]
        # The supervisor did start the workload; sandboxd does not pretend either way: Failed and reserved.
        wait_until(lambda: len(d.cgroup_procs(sid)) == 1)
        again = await c.create(CreateRequest(request_id="u", argv=["sleep", "1000"]))
        assert again.sandbox.sandbox_id == sid and again.sandbox.state == State.FAILED
        assert "outcome unknown" in (again.sandbox.reason or "")
        assert (await c.resource()).reserved.memory_bytes == again.sandbox.resources.memory_bytes
        # Cleanup goes by the identity the supervisor persisted before starting anything.
        await c.delete(ref_of(again))
        assert not d.v2_cgroup(sid).exists()
        assert (await c.resource()).reserved.memory_bytes == 0


async def _create_killed_at(d: Daemon, fault: str, sandbox_id: str) -> None:
    """A create (request ID ``c``) whose daemon is SIGKILLed at ``fault``."""
    d.start(env={"ADX_SANDBOXD_FAULTS": fault})
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError):
            await c.create(CreateRequest(request_id="c", sandbox_id=sandbox_id, argv=["sleep", "1000"]))
    assert d.proc is not None and d.proc.wait(10) == -9


@pytest.mark.req("SBX-10", "SBX-11", "SBX-13")
async def test_sigkill_after_the_create_commit_is_adopted_by_observation_never_restarted(
    sandboxd: DaemonFactory,
) -> None:
    # The start is requested before the commit is done; the supervisor waits for the record on the lifecycle
    # lock, which the daemon's death releases right after the commit: the sandbox starts without sandboxd.
    d = sandboxd(start=False)
    await _create_killed_at(d, "create.after_commit", "half-made")
    d.start()
    async with d.client() as c:
        again = await c.create(CreateRequest(request_id="c", sandbox_id="half-made", argv=["sleep", "1000"]))
        # Startup waited for the supervisor under its lifecycle lock, then observed what it did.
        assert "interrupted" in (again.sandbox.reason or "")
        if again.sandbox.state == State.RUNNING:
            assert again.sandbox.native is not None and d.cgroup_procs("half-made")
        else:  # startup got the lock first: failed under it, and the supervisor then refused to start
            assert again.sandbox.state == State.FAILED and not d.v2_cgroup("half-made").exists()
        assert (await c.resource()).reserved.memory_bytes == again.sandbox.resources.memory_bytes
        await c.delete(ref_of(again))
        assert (await c.resource()).reserved.memory_bytes == 0
        assert not d.v2_cgroup("half-made").exists()


@pytest.mark.req("SBX-10", "SBX-11", "SBX-13")
async def test_sigkill_before_the_create_commit_never_starts_and_reclaims_the_orphaned_dir(
    sandboxd: DaemonFactory,
) -> None:
    # Killed with the start requested (the supervisor waits on the lifecycle lock the daemon holds) and the
    # record not yet renamed into place: the supervisor finds no record and never starts; the restart finds
    # the ID's dir uncommitted, tombstones it and reclaims what the create had made (subdirs, temp record).
    d = sandboxd(start=False)
    await _create_killed_at(d, "create.before_commit", "never-made")
    sdir = d.sandbox_dir("never-made")
    assert (sdir / "upper").is_dir() and (sdir / ".record.json.tmp").exists()  # what the restart must clean
    d.start()
    async with d.client() as c:
        assert await c.list() == []
        assert (await c.resource()).reserved.memory_bytes == 0
        assert sorted(p.name for p in sdir.iterdir()) == ["lifecycle.lock", "tombstone.json"]
        assert "interrupted" in json.loads((sdir / "tombstone.json").read_text())["reason"]
        assert not d.v2_cgroup("never-made").exists()
        assert not (sdir / "native.json").exists()
        fresh = await c.create(CreateRequest(request_id="c", argv=["sleep", "1000"]))  # the request ID is free
        assert fresh.sandbox.sandbox_id != "never-made"
        with pytest.raises(ConflictError):  # the ID is not
            await c.create(CreateRequest(request_id="d", sandbox_id="never-made", argv=["sleep", "1000"]))
        await c.delete(ref_of(fresh))


@pytest.mark.req("SBX-13")
async def test_a_refused_veth_start_leaves_no_veth_behind(sandboxd: DaemonFactory) -> None:
    """The supervisor makes a cold start's veth pair before it sees the record commit (beside its cgroup join,
    issue 13): a start it then refuses (killed before the commit: no committed record) kills the init, and the
    pair goes with the init's network namespace; the restart leaves nothing of it."""
    from adx.sandboxd._veth import host_if

    d = sandboxd(start=False, defaults={"network": "veth"})
    await _create_killed_at(d, "create.before_commit", "never-up")
    veth = host_if("never-up")

    def gone() -> bool:
        return subprocess.run(["ip", "link", "show", "dev", veth], capture_output=True).returncode != 0

    wait_until(gone, timeout=10)
    d.start()
    async with d.client() as c:
        assert await c.list() == []
        assert gone() and not d.v2_cgroup("never-up").exists()
