"""SIGKILL of sandboxd in the middle of an operation that freezes or restores a sandbox, then a restart.

Found by the 30-minute fault soak: a node resumed an Environment (a restore: its record persisted only as
``creating``), paused it at once, and sandboxd was SIGKILLed after the freeze but before the paused record was
durable. Every restart then failed to settle the create (``creating -> paused``), refused every Pause
("is creating") and left the sandbox frozen, so commands timed out forever.

The rule these tests hold sandboxd to: a freeze is acknowledged only by a durable ``paused`` record (Pause
replies after it; Checkpoint thaws before it replies). A cgroup found frozen at startup whose persisted record
is not ``paused`` was frozen by an operation whose caller was told nothing but "uncertain" (SBX-6): startup
thaws it and reports Running; an acknowledged pause stays frozen and Paused.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
from pathlib import Path

import pytest
from sbx_helpers import Daemon, DaemonFactory, wait_until

from adx.errors import UncertainOutcomeError
from adx.sandboxd import CreateRequest, CreateResponse, RestoreRequest, State, ref_of
from adx.sandboxd._spawn_client import FAULTS_ENV

# Writes an ever-growing counter into its upper layer: it moves only while the sandbox is not frozen.
COUNTER = [
    "/bin/sh",
    "-c",
    "i=0; while :; do i=$((i+1)); echo $i > /work/n.tmp; mv /work/n.tmp /work/n; sleep 0.01; done",
]


def _counter(d: Daemon, sandbox_id: str) -> int:
    path = d.sandbox_dir(sandbox_id) / "upper/work/n"
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return 0


def _frozen(d: Daemon, sandbox_id: str) -> bool:
    events = (d.v2_cgroup(sandbox_id) / "cgroup.events").read_text().split("\n")
    return "frozen 1" in events


def _init_pid(d: Daemon, sandbox_id: str) -> int:
    """The host PID of the sandbox's PID 1 (the counter's shell; its sleep and mv children come and go)."""
    for pid in d.cgroup_procs(sandbox_id):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            continue
        if next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1] == "1":
            return pid
    raise AssertionError(f"sandbox {sandbox_id} has no PID 1")


def _persisted_state(d: Daemon, sandbox_id: str) -> str:
    state: str = json.loads((d.sandbox_dir(sandbox_id) / "record.json").read_text())["record"]["state"]
    return state


def _moves(d: Daemon, sandbox_id: str) -> None:
    start = _counter(d, sandbox_id)
    wait_until(lambda: _counter(d, sandbox_id) > start + 3)


async def _stands_still(d: Daemon, sandbox_id: str) -> None:
    before = _counter(d, sandbox_id)
    await asyncio.sleep(0.3)
    assert _counter(d, sandbox_id) == before


async def _create_counting(d: Daemon, request_id: str) -> CreateResponse:
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id=request_id, argv=COUNTER))
    _moves(d, created.sandbox.sandbox_id)
    return created


def _killed(d: Daemon) -> None:
    assert d.proc is not None and d.proc.wait(10) == -9  # the fault point SIGKILLed it


async def _three_pause_resume_cycles(d: Daemon, created: CreateResponse) -> None:
    """What the node does next: pause (freeze + checkpoint), resume; three times (E2B #884, #736)."""
    sid = created.sandbox.sandbox_id
    async with d.client() as c:
        for _ in range(3):
            assert (await c.pause(ref_of(created))).state == State.PAUSED
            await _stands_still(d, sid)
            ck = await c.checkpoint(ref_of(created))
            assert ck.source_sandbox_id == sid
            await c.delete_checkpoint(ck.location, ck.digest)
            assert (await c.resume(ref_of(created))).state == State.RUNNING
            _moves(d, sid)


@pytest.mark.req("SBX-10", "SBX-2", "SBX-6", "SBX-11", "SBX-5")
async def test_sigkill_mid_pause_of_a_just_created_sandbox_settles_running_and_thawed(sandboxd: DaemonFactory) -> None:
    # The soak's sequence: a create (only its `creating` intent is persisted; Running is an observation), a Pause
    # at once, SIGKILL after the freeze and before the paused record is durable.
    d = sandboxd(start=False)
    d.start(env={FAULTS_ENV: "pause.after_freeze"})
    created = await _create_counting(d, "resumed")
    sid = created.sandbox.sandbox_id
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError):
            await c.pause(ref_of(created))
    _killed(d)
    assert _persisted_state(d, sid) == "creating"  # the incident's precondition, exactly
    assert _frozen(d, sid)
    init = _init_pid(d, sid)

    d.start()
    async with d.client() as c:
        assert (await c.health()).deferred_errors == []  # the interrupted create settled
        info = await c.get(ref_of(created))
        assert info.state == State.RUNNING and info.native == created.sandbox.native
        assert not _frozen(d, sid)
        _moves(d, sid)
        assert _init_pid(d, sid) == init  # adopted and thawed, neither killed nor restarted (SBX-5, SBX-11)
        assert _persisted_state(d, sid) == "running"  # settled durably: the next restart has nothing to settle
    await _three_pause_resume_cycles(d, created)
    async with d.client() as c:
        await c.delete(ref_of(created))
        assert await c.list() == []


@pytest.mark.req("SBX-10", "SBX-2", "SBX-6")
async def test_sigkill_mid_pause_of_a_running_sandbox_thaws_it_and_an_acknowledged_pause_stays_paused(
    sandboxd: DaemonFactory,
) -> None:
    d = sandboxd()
    interrupted = await _create_counting(d, "interrupted")
    acknowledged = await _create_counting(d, "acknowledged")
    isid, asid = interrupted.sandbox.sandbox_id, acknowledged.sandbox.sandbox_id
    async with d.client() as c:
        await c.pause(ref_of(interrupted))
        await c.resume(ref_of(interrupted))  # its record is now persisted running
        assert (await c.pause(ref_of(acknowledged))).state == State.PAUSED  # acknowledged: durable paused
    d.kill()
    d.start(env={FAULTS_ENV: "pause.after_freeze"})
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError):
            await c.pause(ref_of(interrupted))
    _killed(d)
    assert _persisted_state(d, isid) == "running" and _frozen(d, isid)
    assert _persisted_state(d, asid) == "paused" and _frozen(d, asid)

    d.start()
    async with d.client() as c:
        assert (await c.get(ref_of(interrupted))).state == State.RUNNING
        assert not _frozen(d, isid)
        _moves(d, isid)
        # Not a blanket thaw: the pause whose paused record was durable stays what its caller was told.
        assert (await c.get(ref_of(acknowledged))).state == State.PAUSED
        assert _frozen(d, asid)
        await _stands_still(d, asid)
        assert (await c.health()).deferred_errors == []
    await _three_pause_resume_cycles(d, interrupted)
    async with d.client() as c:
        await c.delete(ref_of(interrupted))
        await c.delete(ref_of(acknowledged))


@pytest.mark.req("SBX-10", "SBX-6", "SBX-11")
async def test_sigkill_mid_checkpoint_of_a_running_sandbox_thaws_it_and_leaves_no_partial_artifact(
    sandboxd: DaemonFactory,
) -> None:
    # Checkpoint freezes a running sandbox for a consistent capture and thaws it before it replies: a SIGKILL
    # in between left it frozen, and startup reported a Paused nobody had asked for.
    d = sandboxd(start=False)
    d.start(env={FAULTS_ENV: "checkpoint.after_freeze"})
    created = await _create_counting(d, "ck")
    sid = created.sandbox.sandbox_id
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError):
            await c.checkpoint(ref_of(created))
    _killed(d)
    assert _persisted_state(d, sid) == "creating" and _frozen(d, sid)

    d.start()
    async with d.client() as c:
        info = await c.get(ref_of(created))
        assert info.state == State.RUNNING and not _frozen(d, sid)
        _moves(d, sid)
        assert (await c.list_checkpoints("local")).checkpoints == []  # nothing half-written is listed
        assert (await c.health()).deferred_errors == []
    await _three_pause_resume_cycles(d, created)
    async with d.client() as c:
        await c.delete(ref_of(created))


@pytest.mark.req("SBX-10", "SBX-13", "SBX-5")
async def test_sigkill_mid_restore_settles_failed_and_reserved_and_the_checkpoint_still_restores(
    sandboxd: DaemonFactory,
) -> None:
    # Killed with the restored layer extracted and the record committed as creating, before the start: the
    # restart settles it (never stuck creating), keeps it reserved until an explicit delete, and the checkpoint
    # is untouched for the next restore.
    d = sandboxd()
    source = await _create_counting(d, "source")
    async with d.client() as c:
        await c.pause(ref_of(source))
        ck = await c.checkpoint(ref_of(source))
        await c.delete(ref_of(source))
    d.kill()
    d.start(env={FAULTS_ENV: "restore.after_extract"})
    token = "t" * 40  # caller-chosen ID and token, as the node's driver does: addressable without the reply
    request = RestoreRequest(
        request_id="r1", location=ck.location, digest=ck.digest, sandbox_id="restored", token=token
    )
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError):
            await c.restore(request)
    _killed(d)
    assert _persisted_state(d, "restored") == "creating"
    assert (d.sandbox_dir("restored") / "upper/work/n").exists()

    d.start()
    async with d.client() as c:
        again = await c.restore(request)  # the retry returns the interrupted one: never a second start
        assert again.sandbox.sandbox_id == "restored"
        assert again.sandbox.state == State.FAILED and "interrupted" in (again.sandbox.reason or "")
        assert not d.v2_cgroup("restored").exists()  # nothing was started
        assert (await c.resource()).reserved.memory_bytes == again.sandbox.resources.memory_bytes
        await c.delete(ref_of(again))
        assert (await c.resource()).reserved.memory_bytes == 0
        fresh = await c.restore(RestoreRequest(request_id="r2", location=ck.location, digest=ck.digest))
        assert fresh.sandbox.state == State.RUNNING
        assert Path(fresh.sandbox.run_dir).parent.joinpath("upper/work/n").exists()  # the checkpoint's files
        await c.delete(ref_of(fresh))
        await c.delete_checkpoint(ck.location, ck.digest)


def _lock_free(d: Daemon, sandbox_id: str) -> bool:
    fd = os.open(d.sandbox_dir(sandbox_id) / "lifecycle.lock", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@pytest.mark.req("SBX-2", "SBX-10", "SBX-6")
async def test_a_paused_sandbox_whose_supervisor_died_is_still_paused_and_a_checkpoint_keeps_it_frozen(
    sandboxd: DaemonFactory,
) -> None:
    # Without its supervisor a sandbox is observed from its cgroup alone: frozen was reported Running, so the
    # node's pause-then-checkpoint thawed the sandbox it had just frozen, and a restart reported it Running.
    d = sandboxd()
    created = await _create_counting(d, "orphan")
    sid = created.sandbox.sandbox_id
    async with d.client() as c:
        assert (await c.pause(ref_of(created))).state == State.PAUSED
        os.kill(d.supervisor_pid(sid), signal.SIGKILL)
        wait_until(lambda: _lock_free(d, sid))
        assert (await c.get(ref_of(created))).state == State.PAUSED
        assert (await c.pause(ref_of(created))).state == State.PAUSED  # the node's pause, then its checkpoint
        ck = await c.checkpoint(ref_of(created))
        assert _frozen(d, sid)
        await _stands_still(d, sid)
    d.kill()
    d.start()
    async with d.client() as c:
        assert (await c.get(ref_of(created))).state == State.PAUSED and _frozen(d, sid)
        assert (await c.resume(ref_of(created))).state == State.RUNNING
        _moves(d, sid)
        await c.delete(ref_of(created))
        await c.delete_checkpoint(ck.location, ck.digest)
        assert not d.v2_cgroup(sid).exists()
