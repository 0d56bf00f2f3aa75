# ruff: noqa: ASYNC240 - the tests look at the host's mounts between awaits; a blocking stat in a test is harmless
"""``disk_quota = "auto"`` (adx up's default): a btrfs pool where the host can mount one, else no enforced disk,
with a warning and health saying why; ``"btrfs"`` refuses to start without one (SEC-3)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory

from adx.sandboxd._storage import pool_paths

pytestmark = pytest.mark.skipif(shutil.which("mkfs.btrfs") is None, reason="needs btrfs-progs")


def _path_without_btrfs_progs(tmp_path: Path) -> str:
    """A PATH with every program of this one except btrfs-progs' (as on a host without the package)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            target = bin_dir / entry.name
            if "btrfs" not in entry.name and not target.exists():
                target.symlink_to(entry.path)
    return str(bin_dir)


@pytest.mark.req("SEC-3")
async def test_auto_mounts_a_pool_where_the_host_can(quota_sandboxd: DaemonFactory) -> None:
    d = quota_sandboxd(disk_quota="auto", storage_image_bytes=4 << 30)
    async with d.client() as c:
        health = await c.health()
    assert health.disk_quota and health.disk_quota_note is None
    assert os.path.ismount(pool_paths(d.state_dir)[1])


@pytest.mark.req("SEC-3")
async def test_auto_without_btrfs_progs_runs_unenforced_and_says_why(
    quota_sandboxd: DaemonFactory, tmp_path: Path
) -> None:
    d = quota_sandboxd(start=False, disk_quota="auto")
    d.start(env={"PATH": _path_without_btrfs_progs(tmp_path)})
    async with d.client() as c:
        health = await c.health()
    assert not health.disk_quota
    assert health.disk_quota_note is not None and "btrfs-progs" in health.disk_quota_note
    assert not os.path.ismount(pool_paths(d.state_dir)[1])
    assert "disk requests are not enforced" in d.log()


async def test_off_says_so_in_health(sandboxd: DaemonFactory) -> None:
    async with sandboxd().client() as c:
        health = await c.health()
    assert not health.disk_quota and health.disk_quota_note == "disk_quota = 'off' in the configuration"
