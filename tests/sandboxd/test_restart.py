"""Restart recovery of sandboxd: SIGKILL while sandboxes run, SIGKILL in the middle of Delete, normal stop."""
# ruff: noqa: ASYNC240, ASYNC220 - tests inspect host files and start a helper process between awaits

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory, remove_sandbox_cgroup, wait_until

from adx.errors import ConflictError, NotFoundError, UnavailableError, UncertainOutcomeError
from adx.sandboxd import CreateRequest, State, ref_of

SLEEPER = ["/bin/sh", "-c", "(setsid sleep 1000 &) ; sleep 1000"]


def _kill_cgroup(d: object, sandbox_id: str) -> None:
    # What an OOM killer or an operator could do while sandboxd is down: end the workload natively.
    (d.v2_cgroup(sandbox_id) / "cgroup.kill").write_text("1")  # type: ignore[attr-defined]


@pytest.mark.req("SBX-1", "SBX-10", "SBX-11", "SBX-6", "SBX-8")
async def test_sigkill_restart_keeps_running_sandboxes_and_reports_dead_and_missing_ones(
    sandboxd: DaemonFactory,
) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = [
            await c.create(CreateRequest(request_id=f"r{i}", argv=SLEEPER, metadata={"n": str(i)})) for i in range(4)
        ]
        owner = (await c.health()).owner
    refs = [ref_of(x) for x in created]
    ids = [x.sandbox.sandbox_id for x in created]
    for sid in ids:
        d.settled_procs(sid)
    d.kill()  # SIGKILL: no shutdown code runs

    # While sandboxd is down: sandbox 2's processes die; sandbox 3 dies and its cgroup vanishes.
    _kill_cgroup(d, ids[2])
    _kill_cgroup(d, ids[3])
    wait_until(lambda: (d.sandbox_dir(ids[2]) / "exit.json").exists())
    wait_until(lambda: (d.sandbox_dir(ids[3]) / "exit.json").exists())
    wait_until(lambda: not d.cgroup_procs(ids[3]))
    remove_sandbox_cgroup(d.cgroup_parent, ids[3])  # "vanished" within the same boot, no tombstone (SBX-8)

    d.start()
    async with d.client() as c:
        assert (await c.health()).owner == owner  # same owner kept (SBX-2)
        listed = {s.sandbox_id: s for s in await c.list()}
        assert set(listed) == set(ids)
        for ref in refs[:2]:
            info = await c.get(ref)  # the old tokens still work
            assert info.state == State.RUNNING
            assert len(d.cgroup_procs(ref.sandbox_id)) >= 2
        dead = await c.get(refs[2])
        assert dead.state == State.TERMINATED
        assert dead.exit is not None and dead.exit.signal == 9
        missing = await c.get(refs[3])
        assert missing.state == State.FAILED and "missing" in (missing.reason or "")
        # Terminated and missing sandboxes stay visible and reserved until an explicit delete.
        res = await c.resource()
        assert res.reserved.memory_bytes == sum(x.sandbox.resources.memory_bytes for x in created)
        # Startup neither restarted the dead workload nor adopted anything.
        assert not d.cgroup_procs(ids[2])
        for ref in refs:
            await c.delete(ref)
        assert (await c.resource()).reserved.memory_bytes == 0
        assert await c.list() == []


@pytest.mark.req("SBX-10", "SBX-2", "SBX-5", "SBX-11")
async def test_sigkill_right_after_create_returns_adopts_the_sandbox_running_with_its_id_and_token(
    sandboxd: DaemonFactory,
) -> None:
    # A create persists only its intent (creating) and replies once the supervisor recorded the native identity
    # and the workload started: the Running it replies with is an observation. A SIGKILL right after the reply
    # must not lose the sandbox: startup adopts it by observing that identity (SBX-10, SBX-2).
    d = sandboxd()
    async with d.client() as c:
        kept = await c.create(CreateRequest(request_id="k", argv=SLEEPER))
        dies = await c.create(CreateRequest(request_id="d", argv=SLEEPER))
        d.kill()
    assert kept.sandbox.state == State.RUNNING
    on_disk = json.loads((d.sandbox_dir(kept.sandbox.sandbox_id) / "record.json").read_text())
    assert on_disk["record"]["state"] == "creating"  # what this test is about: nothing but the intent persisted
    procs = d.settled_procs(kept.sandbox.sandbox_id)
    _kill_cgroup(d, dies.sandbox.sandbox_id)  # and one whose workload ends while sandboxd is down
    wait_until(lambda: (d.sandbox_dir(dies.sandbox.sandbox_id) / "exit.json").exists())

    d.start()
    async with d.client() as c:
        listed = {s.sandbox_id: s for s in await c.list()}
        assert listed[kept.sandbox.sandbox_id].state == State.RUNNING
        info = await c.get(ref_of(kept))  # the same ID and token (and generation) still work
        assert info.state == State.RUNNING and info.native == kept.sandbox.native
        assert d.cgroup_procs(kept.sandbox.sandbox_id) == procs  # adopted, neither killed nor restarted
        dead = await c.get(ref_of(dies))
        assert dead.state == State.TERMINATED and dead.exit is not None and dead.exit.signal == 9
        assert not d.cgroup_procs(dies.sandbox.sandbox_id)  # never restarted (SBX-5, SBX-11)
        for created in (kept, dies):
            await c.delete(ref_of(created))
        assert await c.list() == []


@pytest.mark.req("SBX-11")
async def test_normal_stop_leaves_sandboxes_running_and_restart_reconnects(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:  # one client across the restart: its pooled connection must not be reused
        created = await c.create(CreateRequest(request_id="r", argv=SLEEPER))
        sid = created.sandbox.sandbox_id
        procs = d.settled_procs(sid)
        d.stop()  # SIGTERM: a normal shutdown
        assert d.proc is not None and d.proc.returncode == 0
        assert d.cgroup_procs(sid) == procs  # nothing was killed or restarted
        with pytest.raises(UnavailableError):
            await c.health()
        d.start()
        info = await c.get(ref_of(created))
        assert info.state == State.RUNNING and info.native == created.sandbox.native
        assert d.cgroup_procs(sid) == procs
        await c.delete(ref_of(created))


@pytest.mark.req("SBX-7", "SBX-12", "SBX-5", "SBX-10")
async def test_sigkill_mid_delete_completes_on_restart_with_tombstone_and_refuses_id_reuse(
    sandboxd: DaemonFactory,
) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="r", sandbox_id="victim", argv=SLEEPER))
        keeper = await c.create(CreateRequest(request_id="k", argv=SLEEPER))
    sid = "victim"
    procs = d.settled_procs(sid)
    d.stop()
    # Restart with a fault point: sandboxd SIGKILLs itself right after persisting the Stopping intent.
    d.start(env={"ADX_SANDBOXD_FAULTS": "delete.after_intent"})
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError):
            await c.delete(ref_of(created))
    assert d.proc is not None and d.proc.wait(10) == -9
    record = json.loads((d.sandbox_dir(sid) / "record.json").read_text())
    assert record["record"]["state"] == "stopping"  # the durable intent
    assert d.cgroup_procs(sid) == procs  # nothing killed yet: the crash came first
    assert not (d.sandbox_dir(sid) / "tombstone.json").exists()

    d.start()  # startup retries the Stopping record before it serves anything
    async with d.client() as c:
        for pid in procs:
            assert not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes()
        assert not d.v2_cgroup(sid).exists()
        tomb = json.loads((d.sandbox_dir(sid) / "tombstone.json").read_text())
        assert tomb["sandbox_id"] == sid and tomb["generation"] == 1
        assert sorted(os.listdir(d.sandbox_dir(sid))) == ["lifecycle.lock", "tombstone.json"]
        res = await c.resource()
        assert res.reserved.memory_bytes == keeper.sandbox.resources.memory_bytes  # released only after empty
        with pytest.raises(NotFoundError):
            await c.get(ref_of(created))
        with pytest.raises(ConflictError, match="never reused"):
            await c.create(CreateRequest(request_id="again", sandbox_id=sid, argv=SLEEPER))
        assert (await c.get(ref_of(keeper))).state == State.RUNNING
        await c.delete(ref_of(keeper))


async def test_a_dead_spawner_is_replaced_and_running_sandboxes_are_unaffected(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        first = await c.create(CreateRequest(request_id="a", argv=SLEEPER))
        assert d.proc is not None
        children = Path(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children").read_text().split()
        [spawner] = [int(p) for p in children if b"_spawner" in Path(f"/proc/{p}/cmdline").read_bytes()]
        os.kill(spawner, 9)
        wait_until(lambda: not _alive(spawner))
        second = await c.create(CreateRequest(request_id="b", argv=SLEEPER))
        assert second.sandbox.state == State.RUNNING
        assert (await c.health()).spawner_alive
        assert (await c.get(ref_of(first))).state == State.RUNNING
        await c.delete(ref_of(first))
        await c.delete(ref_of(second))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.req("SBX-10", "SBX-2")
async def test_pause_freezes_in_place_and_a_restart_maps_it_to_paused(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    counter = [
        "/bin/sh",
        "-c",
        "i=0; while :; do i=$((i+1)); echo $i > /work/n.tmp; mv /work/n.tmp /work/n; sleep 0.01; done",
    ]
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="p", argv=counter))
        n = d.sandbox_dir(created.sandbox.sandbox_id) / "upper/work/n"
        wait_until(lambda: n.exists() and int(n.read_text()) > 3)
        assert (await c.pause(ref_of(created))).state == State.PAUSED
        frozen_at = n.read_text()
        await asyncio.sleep(0.3)
        assert n.read_text() == frozen_at
    d.kill()
    d.start()
    async with d.client() as c:
        assert (await c.get(ref_of(created))).state == State.PAUSED  # native Paused -> Paused
        assert (await c.resume(ref_of(created))).state == State.RUNNING
        wait_until(lambda: int(n.read_text()) > int(frozen_at) + 3)
        await c.pause(ref_of(created))
        await c.delete(ref_of(created))  # a frozen sandbox is deleted like any other
        assert not d.v2_cgroup(created.sandbox.sandbox_id).exists()


@pytest.mark.req("SBX-12")
async def test_reclaim_interrupted_after_the_tombstone_continues_on_restart(sandboxd: DaemonFactory) -> None:
    d = sandboxd(start=False)
    d.start(env={"ADX_SANDBOXD_FAULTS": "delete.after_tombstone"})
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="t", argv=SLEEPER))
        sid = created.sandbox.sandbox_id
        d.settled_procs(sid)
        with pytest.raises(UncertainOutcomeError):
            await c.delete(ref_of(created))
    assert d.proc is not None and d.proc.wait(10) == -9
    sdir = d.sandbox_dir(sid)
    assert (sdir / "tombstone.json").exists() and (sdir / "upper").exists()  # tombstoned, not yet reclaimed
    assert not d.cgroup_procs(sid)  # emptiness was proven before the tombstone
    d.start()
    async with d.client() as c:
        assert sorted(os.listdir(sdir)) == ["lifecycle.lock", "tombstone.json"]
        assert not d.v2_cgroup(sid).exists()
        assert (await c.resource()).reserved.memory_bytes == 0
        with pytest.raises(NotFoundError):
            await c.get(ref_of(created))


@pytest.mark.req("SBX-5", "SBX-8")
async def test_a_replaced_cgroup_is_not_the_sandbox_and_is_never_killed(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="r", argv=SLEEPER))
    sid = created.sandbox.sandbox_id
    d.settled_procs(sid)
    d.kill()
    (d.v2_cgroup(sid) / "cgroup.kill").write_text("1")
    wait_until(lambda: (d.sandbox_dir(sid) / "exit.json").exists() and not d.cgroup_procs(sid))
    remove_sandbox_cgroup(d.cgroup_parent, sid)
    # Someone else creates a cgroup of the same name (new inode) and runs a process in it.
    d.v2_cgroup(sid).mkdir()
    stranger = subprocess.Popen(["sleep", "1000"])
    try:
        (d.v2_cgroup(sid) / "cgroup.procs").write_text(str(stranger.pid))
        d.start()
        async with d.client() as c:
            info = await c.get(ref_of(created))
            assert info.state == State.FAILED and "replaced" in (info.reason or "")
            await c.delete(ref_of(created))  # explicit delete completes without touching the stranger
        assert stranger.poll() is None and d.cgroup_procs(sid) == {stranger.pid}
        assert (d.sandbox_dir(sid) / "tombstone.json").exists()
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.req("SBX-10", "SBX-11", "SBX-5")
async def test_spare_sandbox_dirs_are_never_sandboxes_and_a_restart_removes_leftovers(
    sandboxd: DaemonFactory,
) -> None:
    d = sandboxd()
    sandboxes = d.state_dir / "sandboxes"

    def spares() -> set[str]:
        return {p.name for p in sandboxes.iterdir() if p.name.startswith(".spare-")}

    made = spares()
    assert len(made) == 2  # pre-made at startup: subdirs, empty files, the lifecycle lock held by sandboxd
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="a", argv=["sleep", "1000"]))
        sid = created.sandbox.sandbox_id
        assert len(made - spares()) == 1  # renamed into place as the sandbox's dir...
        wait_until(lambda: len(spares()) == 2)  # ...and replaced after the create
        sdir = d.sandbox_dir(sid)
        assert {"upper", "ovlwork", "rootfs", "run", "record.json", "native.json", "output.log"} <= {
            p.name for p in sdir.iterdir()
        }
        # A used ID never takes a spare's place (rename without replace): the spare stays for the next create.
        with pytest.raises(ConflictError):
            await c.create(CreateRequest(request_id="b", sandbox_id=sid, argv=["true"]))
        assert len(spares()) == 2
    d.kill()
    leftover = spares() | {".spare-orphan"}
    (sandboxes / ".spare-orphan" / "upper").mkdir(parents=True)  # e.g. one a crash left half-made
    d.start()
    assert not spares() & leftover and len(spares()) == 2
    async with d.client() as c:
        assert [s.sandbox_id for s in await c.list()] == [sid]
        assert (await c.get(ref_of(created))).state == State.RUNNING
        await c.delete(ref_of(created))
