"""A Wait sleeps until something it must look at changed (sandboxd/_wait_watch.py), on a real sandboxd.

Each Wait used to poll its sandbox (a stat every 20 ms, a native query every second): with 500 idle sandboxes
sandboxd's main process burned half a core doing nothing (bench/bench_density.py). Now it is woken by the exit
record's arrival, the cgroup's events and changes of the record; its own periodic query runs every 10 s only.
So each case below would take ~10 s if its wake-up were missing: each asserts an answer within 3 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from sbx_helpers import Daemon, DaemonFactory, wait_until

from adx.sandboxd import CreateRequest, CreateResponse, State, ref_of

SLEEPER = ["sleep", "1000"]
PROMPT = 3.0  # seconds; the periodic query of a watched sandbox runs every 10 s


async def _create(d: Daemon, name: str, argv: list[str]) -> CreateResponse:
    async with d.client() as c:
        return await c.create(CreateRequest(request_id=name, argv=argv))


def _inotify_watches(pid: int) -> int:
    """How many inotify watches process ``pid`` holds (``/proc/PID/fdinfo`` lists one ``inotify wd:`` line each)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) == "anon_inode:inotify":
                count += (Path(f"/proc/{pid}/fdinfo") / fd.name).read_text().count("inotify wd:")
        except OSError:
            continue
    return count


@pytest.mark.req("SBX-2")
async def test_a_wait_answers_at_once_when_the_workload_exits_on_its_own(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    created = await _create(d, "exits", ["sh", "-c", "sleep 0.5; exit 3"])
    async with d.client() as c:
        start = time.monotonic()
        waited = await c.wait(ref_of(created), timeout_seconds=30)
        took = time.monotonic() - start
    assert waited.done and waited.sandbox.state == State.TERMINATED
    assert waited.sandbox.exit is not None and waited.sandbox.exit.exit_code == 3
    assert took < PROMPT, f"the exit record's arrival did not wake the Wait ({took:.1f} s)"


@pytest.mark.req("SBX-2", "SBX-6")
async def test_a_wait_answers_when_the_last_process_ends_with_no_supervisor_left(sandboxd: DaemonFactory) -> None:
    # No exit record is ever written (its writer is gone): the cgroup's populated event is what wakes the Wait.
    d = sandboxd()
    created = await _create(d, "orphaned", SLEEPER)
    sid = created.sandbox.sandbox_id
    os.kill(d.supervisor_pid(sid), signal.SIGKILL)
    async with d.client() as c:
        waiting = asyncio.create_task(c.wait(ref_of(created), timeout_seconds=30))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        start = time.monotonic()
        for pid in d.cgroup_procs(sid):
            os.kill(pid, signal.SIGKILL)
        waited = await waiting
        took = time.monotonic() - start
        assert waited.done and waited.sandbox.state == State.TERMINATED
        assert took < PROMPT, f"the cgroup's events did not wake the Wait ({took:.1f} s)"
        await c.delete(ref_of(created))


@pytest.mark.req("SBX-2")
async def test_waits_end_at_a_delete_and_leave_no_watch_behind(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    assert d.proc is not None
    created = await _create(d, "deleted", SLEEPER)
    async with d.client() as c, d.client() as c2:
        waits = [asyncio.create_task(client.wait(ref_of(created), timeout_seconds=30)) for client in (c, c2)]
        # Both Waits are in: the sandbox's directory and its cgroup's events are watched, once for the two.
        for _ in range(250):
            if _inotify_watches(d.proc.pid) == 2:
                break
            await asyncio.sleep(0.02)
        assert _inotify_watches(d.proc.pid) == 2
        start = time.monotonic()
        await c.delete(ref_of(created))
        for waited in await asyncio.gather(*waits):
            assert waited.done and waited.sandbox.state in (State.STOPPING, State.DELETED)
        assert time.monotonic() - start < PROMPT + 5  # the delete itself stops the workload first
    wait_until(lambda: _inotify_watches(d.proc.pid) == 0 if d.proc else False)


@pytest.mark.req("SBX-2")
async def test_a_wait_that_times_out_says_not_done_and_drops_its_watches(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    assert d.proc is not None
    created = await _create(d, "timeout", SLEEPER)
    async with d.client() as c:
        start = time.monotonic()
        waited = await c.wait(ref_of(created), timeout_seconds=0.5)
        assert not waited.done and waited.sandbox.state == State.RUNNING
        assert 0.4 < time.monotonic() - start < PROMPT
        assert _inotify_watches(d.proc.pid) == 0
        # A pause and a resume are record changes: a Wait in flight looks, and goes on waiting.
        waiting = asyncio.create_task(c.wait(ref_of(created), timeout_seconds=2))
        await asyncio.sleep(0.2)
        assert (await c.pause(ref_of(created))).state == State.PAUSED
        assert (await c.resume(ref_of(created))).state == State.RUNNING
        waited = await waiting
        assert not waited.done and waited.sandbox.state == State.RUNNING
        await c.delete(ref_of(created))
