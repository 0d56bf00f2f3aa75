"""A real ``adx up`` for CLI tests (every daemon a real process: Redis, PostgreSQL, sandboxd, Coordinator, node,
API), started in a directory of its own with a private XDG_CONFIG_HOME, so each test runs the real ``adx`` command
as a user would from elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ADX = [sys.executable, "-m", "adx"]


@dataclass
class UpCluster:
    root: Path
    state: Path
    config_home: Path  # XDG_CONFIG_HOME of the user who ran `adx up`
    out: Path
    err: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The user's environment: no ADX_* variable, only where their config lives (and the host-derived base
        image and no btrfs pool per test, tests/conftest.py)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("ADX_")}
        return {
            **base,
            "XDG_CONFIG_HOME": str(self.config_home),
            "COLUMNS": "200",
            "ADX_UP__BASE_IMAGE": "host",
            "ADX_UP__DISK_QUOTA": "off",
            **extra,
        }

    def adx(self, *args: str, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
        """``adx ARGS`` from another directory than the one `adx up` ran in."""
        elsewhere = cwd or self.root / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        return subprocess.run(
            [*ADX, *args], capture_output=True, text=True, timeout=120, env=self.env(**extra), cwd=elsewhere
        )


def wait_until_up(up: subprocess.Popen[bytes], out_path: Path, timeout: float = 180) -> None:
    """Until the ``adx up`` writing to ``out_path`` says it is ready (it fails the test if it exits first)."""
    deadline = time.monotonic() + timeout
    while "Press Ctrl-C" not in out_path.read_text():
        assert up.poll() is None, out_path.read_text()
        assert time.monotonic() < deadline, out_path.read_text()
        time.sleep(0.2)


@pytest.fixture(scope="module")
def up_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpCluster]:
    root = tmp_path_factory.mktemp("up")
    started_in = root / "started-here"
    started_in.mkdir()
    cluster = UpCluster(root, root / "state", root / "config", root / "up.out", root / "up.err")
    env = cluster.env(ADX_UP__API_LISTEN="127.0.0.1:0", ADX_UP__HEALTH_INTERVAL_SECONDS="0.2")
    with cluster.out.open("w") as out, cluster.err.open("w") as err:
        proc = subprocess.Popen(
            [*ADX, "up", "--state-dir", "state"], stdout=out, stderr=err, text=True, env=env, cwd=root
        )
    try:
        deadline = time.monotonic() + 120
        while "Press Ctrl-C" not in cluster.out.read_text():
            assert proc.poll() is None, f"adx up exited: {cluster.out.read_text()}\n{cluster.err.read_text()}"
            assert time.monotonic() < deadline, cluster.out.read_text()
            time.sleep(0.2)
        yield cluster
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        from sbx_helpers import cleanup_cgroup_parent

        from adx.cli._up_cluster import cgroup_parent_name

        cleanup_cgroup_parent(cgroup_parent_name(cluster.state.absolute()))
