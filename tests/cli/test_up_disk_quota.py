"""`adx up` enforces disk by default (issue 13): on a host that can mount btrfs from a loop device, its sandboxd
runs with ``disk_quota = "auto"`` -> a btrfs pool beside the state directory, so an Environment's ``disk``
limits its writable layer and a pause is a snapshot, not a copy; ``adx down`` unmounts the pool once no
sandbox of the cluster is left. Every other test pins ``ADX_UP__DISK_QUOTA=off`` (tests/conftest.py): a pool
per test state directory would be a loop mount each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import wait_until_up

from adx.config import UpConfig, load_model
from adx.sandboxd._storage import mounted, pool_paths

ADX = [sys.executable, "-m", "adx"]


def test_adx_up_defaults_to_auto_and_refuses_other_values() -> None:
    assert load_model(UpConfig, "up", None, environ={}).disk_quota == "auto"
    assert load_model(UpConfig, "up", None, environ={"ADX_UP__DISK_QUOTA": "off"}).disk_quota == "off"
    with pytest.raises(Exception, match="disk_quota"):
        load_model(UpConfig, "up", None, environ={"ADX_UP__DISK_QUOTA": "xfs"})


@pytest.mark.req("SEC-3")
def test_adx_up_limits_disk_pauses_by_snapshot_and_down_unmounts_the_pool(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADX_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), COLUMNS="200", ADX_UP__API_LISTEN="127.0.0.1:0")
    env.update(ADX_UP__BASE_IMAGE="host")  # no Debian build per test; disk_quota left at its default
    state = tmp_path / "state"
    image, mount = pool_paths((state / "sandboxd" / "data").absolute())
    out_path = tmp_path / "up.out"
    with out_path.open("w") as out:
        up = subprocess.Popen([*ADX, "up", "--state-dir", str(state)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_up(up, out_path)
        assert "disk: enforced" in out_path.read_text(), out_path.read_text()
        assert mounted(mount) and image.is_file()

        def adx(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*ADX, *args], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)

        made = adx("env", "create", "--cpu", "0.25", "--memory", "128Mi", "--disk", "64Mi", "--json")
        assert made.returncode == 0, made.stdout + made.stderr
        env_id = json.loads(made.stdout)["id"]
        kept = adx("env", "exec", env_id, "--", "sh", "-c", "echo kept > /tmp/kept && echo ok")
        assert kept.returncode == 0 and "ok" in kept.stdout, kept.stdout + kept.stderr
        over = adx("env", "exec", env_id, "--", "dd", "if=/dev/zero", "of=/work/big", "bs=1M", "count=128")
        assert over.returncode != 0, over.stdout
        assert "quota exceeded" in (over.stdout + over.stderr).lower(), over.stdout + over.stderr

        paused = adx("env", "pause", env_id)
        assert paused.returncode == 0, paused.stdout + paused.stderr
        deadline = time.monotonic() + 60
        while (shown := json.loads(adx("env", "get", env_id, "--json").stdout))["state"] != "paused":
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)
        back = adx("env", "exec", env_id, "--", "cat", "/tmp/kept")  # a command wakes it (WAKE-*)
        assert back.returncode == 0 and back.stdout.strip() == "kept", back.stdout + back.stderr

        done = adx("down", "--delete", "--yes")
        assert done.returncode == 0, done.stdout + done.stderr
        assert up.wait(30) == 0
        assert not mounted(mount), "adx down unmounts the pool once no sandbox uses it"
        assert "storage pool unmounted" in done.stdout, done.stdout
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(120)
        from sbx_helpers import cleanup_cgroup_parent

        from adx.cli._up_cluster import cgroup_parent_name

        cleanup_cgroup_parent(cgroup_parent_name(state.absolute()))
        if mounted(mount):
            subprocess.run(["umount", "-l", str(mount)], check=False)
