"""`adx env logs` and `adx down` on a real `adx up` (every daemon a real process; one cluster, it takes long to
start): logs are read back, followed, kept across workload restarts (RST-2) and while paused, and reclaimed
with the Environment (MET-5); `adx down` finds the cluster by itself, deletes the Environments with progress
output, stops `adx up`, and leaves no sandbox of the cluster on the host."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import wait_until_up

ADX = [sys.executable, "-m", "adx"]


def _sandbox_cgroups(state: Path) -> list[str]:
    from sbx_helpers import _hierarchy_roots

    from adx.cli._up_cluster import cgroup_parent_name

    parent = cgroup_parent_name(state.absolute())
    dirs = [root / parent for root in _hierarchy_roots() if (root / parent).is_dir()]
    return sorted({p.name for d in dirs for p in d.iterdir() if p.is_dir()})


def _logs(adx: Any, state: Path) -> None:
    loop = (
        "import sys, time\nprint('hello err', file=sys.stderr, flush=True)\n"
        "for i in range(100000):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.2)"
    )
    made = adx(
        "env",
        "create",
        "--cpu",
        "0.25",
        "--memory",
        "128Mi",
        "--entrypoint",
        f"python3 -c {shlex.quote(loop)}",
        "--json",
    )
    assert made.returncode == 0, made.stdout + made.stderr
    env_id = json.loads(made.stdout)["id"]
    time.sleep(1.5)
    got = adx("env", "logs", env_id)
    assert got.returncode == 0, got.stderr
    assert "hello err" in got.stderr and "hello err" not in got.stdout, "stderr lines go to stderr"
    assert got.stdout.startswith("tick 0\ntick 1\n")
    tail = adx("env", "logs", env_id, "--tail", "1", "--json")
    line = json.loads(tail.stdout)
    assert line["stream"] == "stdout" and line["text"].startswith("tick ") and line["executionId"]
    # --follow prints lines written after it started (stopped by the timeout here).
    try:
        subprocess.run(
            [*ADX, "env", "logs", env_id, "-f", "--tail", "0"], capture_output=True, text=True, timeout=15, env=adx.env
        )
    except subprocess.TimeoutExpired as exc:
        followed = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
    numbers = [int(t.split()[1]) for t in followed.splitlines()]
    assert len(numbers) >= 3 and numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert numbers[0] > int(json.loads(tail.stdout)["text"].split()[1])
    # Paused: still readable, and reading does not wake it.
    paused = adx("env", "pause", env_id)
    assert paused.returncode == 0, paused.stderr
    assert adx("env", "logs", env_id, "--tail", "1").stdout.startswith("tick ")
    assert json.loads(adx("env", "get", env_id, "--json").stdout)["state"] == "paused"
    # Deleted: the node reclaims the log (MET-5).
    assert adx("env", "delete", env_id, "--wait").returncode == 0
    group = state / "sandboxd" / "data" / "logs" / env_id
    deadline = time.monotonic() + 30
    while group.exists():
        assert time.monotonic() < deadline, "the deleted Environment's log was not reclaimed"
        time.sleep(0.2)
    # Restarts (RST-2): every execution's output, one log.
    crash = "import sys; print('run', flush=True); sys.exit(3)"
    made = adx(
        "env",
        "create",
        "--cpu",
        "0.25",
        "--memory",
        "128Mi",
        "--entrypoint",
        f"python3 -c {shlex.quote(crash)}",
        "--max-retries",
        "2",
        "--backoff",
        "0.2",
        "--max-backoff",
        "0.4",
        "--no-wait",
        "--json",
    )
    assert made.returncode == 0, made.stdout + made.stderr
    flaky = json.loads(made.stdout)["id"]
    deadline = time.monotonic() + 60
    while True:
        every = [json.loads(x) for x in adx("env", "logs", flaky, "--json").stdout.splitlines()]
        # execd (PID 1) logs its own lines (start, the workload's exit) to stderr: they are in the log too.
        lines = [x for x in every if x["stream"] == "stdout"]
        if len(lines) >= 3:
            break
        assert time.monotonic() < deadline, lines
        time.sleep(0.5)
    assert [x["text"] for x in lines] == ["run", "run", "run"]
    assert len({x["executionId"] for x in lines}) == 3, "each restart is a new execution"
    assert adx("env", "delete", flaky, "--wait").returncode == 0


@pytest.mark.req("MET-5", "RST-2")
def test_logs_then_down_deletes_environments_stops_up_and_leaves_no_sandbox(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADX_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), COLUMNS="200", ADX_UP__API_LISTEN="127.0.0.1:0")
    env.update(ADX_UP__BASE_IMAGE="host", ADX_UP__DISK_QUOTA="off")  # no Debian build, no pool (tests/conftest.py)
    state = tmp_path / "state"
    out_path = tmp_path / "up.out"
    with out_path.open("w") as out:
        up = subprocess.Popen([*ADX, "up", "--state-dir", str(state)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_up(up, out_path)
        assert json.loads((state / "up.json").read_text())["pid"] == up.pid

        def adx(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*ADX, *args], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)

        adx.env = env  # type: ignore[attr-defined]

        _logs(adx, state)

        ids = []
        for _ in range(2):
            made = adx("env", "create", "--cpu", "0.25", "--memory", "128Mi", "--json")
            assert made.returncode == 0, made.stdout + made.stderr
            ids.append(json.loads(made.stdout)["id"])
        # One cgroup each (a cold create's is named by its ID, a claimed warm member keeps its `_warm-` name), and
        # sandboxd's warm members beside them: down must leave none of either.
        assert len(_sandbox_cgroups(state)) >= 2

        refused = adx("down", "--yes")
        assert refused.returncode != 0 and "--delete/--pause/--keep" in refused.stderr
        assert up.poll() is None, "nothing was stopped"

        done = adx("down", "--delete", "--yes")
        assert done.returncode == 0, done.stdout + done.stderr
        for index, env_id in enumerate(ids, 1):
            assert f"[{index}/2] delete {env_id} ... done" in done.stdout
        assert "cluster stopped" in done.stdout
        assert up.wait(30) == 0
        assert not (state / "up.json").exists()
        assert _sandbox_cgroups(state) == [], "no sandbox of the cluster is left"

        again = adx("down", "--keep")
        assert again.returncode == 0 and "is not running" in again.stdout
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(120)
        from sbx_helpers import cleanup_cgroup_parent

        from adx.cli._up_cluster import cgroup_parent_name

        cleanup_cgroup_parent(cgroup_parent_name(state.absolute()))
