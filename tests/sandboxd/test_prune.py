"""`adx sandbox prune`: sandboxes left by a sandboxd whose state directory was removed are found and removed;
nothing of another sandboxd's (whose state directory exists) is touched (real sandboxes, real SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys

from sbx_helpers import DaemonFactory, wait_until

from adx.sandboxd import CreateRequest, State, ref_of
from adx.sandboxd._prune import find_orphans

SLEEP = ["python3", "-c", "import time\nwhile True: time.sleep(1)"]


async def _adx(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "adx", *args], capture_output=True, text=True, timeout=60
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        status = f.read().rsplit(")", 1)[1].split()[0]
    return status != "Z"


async def test_prune_removes_sandboxes_of_a_removed_state_dir_and_nothing_else(sandboxd: DaemonFactory) -> None:
    gone = sandboxd("gone")
    live = sandboxd("live")
    async with gone.client() as c:
        doomed = [
            (await c.create(CreateRequest(request_id=f"g{i}", argv=SLEEP, network=net))).sandbox
            for i, net in enumerate(("none", "veth"))
        ]
    async with live.client() as c:
        kept = await c.create(CreateRequest(request_id="k1", argv=SLEEP))
    doomed_procs = set()
    for info in doomed:
        doomed_procs |= gone.settled_procs(info.sandbox_id, count=1)
    parents = [gone.cgroup_parent, live.cgroup_parent]

    # Before the state dir is gone nothing is an orphan: a killed sandboxd's sandboxes wait for its restart.
    gone.kill()
    assert find_orphans(parents) == []

    shutil.rmtree(gone.state_dir)
    found = {o.sandbox_id: o for o in find_orphans(parents)}
    assert set(found) == {info.sandbox_id for info in doomed}
    assert all(o.state_dir == str(gone.state_dir) for o in found.values())
    supervisors = [o.supervisor for o in found.values()]
    helpers = [pid for o in found.values() for pid in o.helpers]  # none: the supervisor pumps the output itself

    command = ["sandbox", "prune", *(f"--cgroup-parent={p}" for p in parents)]
    dry = await _adx(*command, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert all(info.sandbox_id in dry.stdout for info in doomed) and "dry run" in dry.stdout
    assert all(_alive(pid) for pid in doomed_procs), "a dry run removes nothing"

    done = await _adx(*command, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"removed {info.sandbox_id}" in done.stdout for info in doomed)
    wait_until(lambda: not any(_alive(pid) for pid in (*doomed_procs, *supervisors, *helpers)), timeout=10)
    for info in doomed:
        assert not gone.v2_cgroup(info.sandbox_id).exists()
    assert find_orphans(parents) == []

    # The other sandboxd's sandbox runs on, untouched.
    async with live.client() as c:
        assert (await c.get(ref_of(kept))).state is State.RUNNING
    assert live.cgroup_procs(kept.sandbox.sandbox_id)
    again = await _adx(*command, "--yes")
    assert "no orphaned sandboxes" in again.stdout
