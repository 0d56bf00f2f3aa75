"""execd's PID 1 duties: reaping orphans, forwarding SIGTERM, exiting cleanly; and the workload.

The PID 1 tests run execd as the first process of a new PID namespace (``unshare --fork --pid --mount-proc``),
exactly as a sandbox's init; they need root (skipped otherwise).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from execd_helpers import ExecdProcess, joined, run

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="PID namespaces need root and unshare(1)"
)
UNSHARE = ["unshare", "--fork", "--pid", "--mount-proc"]


def child_of(pid: int) -> int:
    """The first child of ``pid`` (unshare --fork's child is execd, PID 1 inside the namespace)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError("unshare has no child")


def wait_exit(execd: ExecdProcess, timeout: float = 10.0) -> int:
    return execd.proc.wait(timeout)


@needs_root
def test_pid1_reaps_orphans(execd_factory: Callable[..., ExecdProcess]) -> None:
    execd = execd_factory(prefix=UNSHARE)
    with execd.client() as client:
        frames, _ = run(client, command="echo $$")
        assert joined(frames, "stdout").strip() != "1"
        health = client.get("/v1/health").json()
        assert health["pid"] == 1, "execd must be PID 1 of the namespace"
        # The shell exits at once; its background sleep is orphaned and re-parented to PID 1 (execd).
        frames, _ = run(client, command="sleep 0.4 >/dev/null 2>&1 & echo $!")
        orphan = int(joined(frames, "stdout"))
        frames, _ = run(client, command=f"cut -d' ' -f3,4 /proc/{orphan}/stat")
        state, ppid = joined(frames, "stdout").split()
        assert state != "Z" and ppid == "1", "the orphan is alive and was re-parented to execd"
        time.sleep(0.8)
        frames, _ = run(client, command=f"cat /proc/{orphan}/stat 2>/dev/null || echo gone")
        assert joined(frames, "stdout").strip() == "gone", "the exited orphan must be reaped, not left a zombie"
        frames, _ = run(client, command="cut -d' ' -f3 /proc/[0-9]*/stat | grep -c Z || true")
        assert joined(frames, "stdout").strip() == "0", "no zombies anywhere in the sandbox"
        assert client.get("/v1/health").json()["orphansReaped"] >= 1


@needs_root
def test_pid1_forwards_sigterm_and_exits_cleanly(execd_factory: Callable[..., ExecdProcess], short_dir: Path) -> None:
    marker = short_dir / "got-term"
    execd = execd_factory(prefix=UNSHARE)
    with execd.client() as client:
        started = client.post(
            "/v1/commands",
            json={
                "command": f"trap 'echo term > {marker}; exit 0' TERM; while :; do sleep 0.05; done",
                "background": True,
            },
        )
        assert started.status_code == 201
    time.sleep(0.2)  # let the shell install its trap
    execd_host_pid = child_of(execd.pid)
    os.kill(execd_host_pid, signal.SIGTERM)
    assert wait_exit(execd) == 0, execd.log.read_text()
    assert marker.read_text() == "term\n", "SIGTERM was forwarded to the command"
    assert not execd.socket.exists(), "the socket is removed on a clean exit"


@needs_root
def test_pid1_sigkills_children_that_ignore_sigterm(execd_factory: Callable[..., ExecdProcess]) -> None:
    execd = execd_factory("--grace-seconds", "0.5", prefix=UNSHARE)
    with execd.client() as client:
        client.post("/v1/commands", json={"command": "trap '' TERM; sleep 30", "background": True})
    time.sleep(0.1)
    started = time.monotonic()
    os.kill(child_of(execd.pid), signal.SIGTERM)
    assert wait_exit(execd) == 0
    assert time.monotonic() - started < 5


def test_sigint_also_shuts_down_cleanly(execd: ExecdProcess) -> None:
    os.kill(execd.pid, signal.SIGINT)
    assert wait_exit(execd) == 0


def test_workload_runs_and_its_exit_ends_execd(execd_factory: Callable[..., ExecdProcess], short_dir: Path) -> None:
    marker = short_dir / "workload-ran"
    execd = execd_factory("--", "/bin/sh", "-c", f"echo started > {marker}; sleep 0.5; exit 3")
    with execd.client() as client:
        workload = client.get("/v1/health").json()["workload"]
        assert workload["state"] == "running" and workload["pid"] > 0
    assert wait_exit(execd) == 3, "execd (the sandbox) exits with the workload's status"
    assert marker.read_text() == "started\n"


def test_keep_running_after_workload_exit(execd_factory: Callable[..., ExecdProcess]) -> None:
    execd = execd_factory("--keep-running-after-workload-exit", "--", "/bin/sh", "-c", "exit 4")
    time.sleep(0.3)
    with execd.client() as client:
        workload = client.get("/v1/health").json()["workload"]
    assert workload["state"] == "exited" and workload["exitCode"] == 4
    assert execd.proc.poll() is None


def test_workload_that_cannot_start_fails_execd(execd_factory: Callable[..., ExecdProcess]) -> None:
    execd = execd_factory("--", "/no/such/workload", wait=False)
    assert wait_exit(execd) == 127
