"""sandboxd test fixtures (helpers live in sbx_helpers)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory

from adx.sandboxd._storage import pool_paths


@pytest.fixture(scope="session")
def sandbox_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One default image for the session: it is a read-only lower layer, so daemons may share it."""
    return tmp_path_factory.mktemp("sandbox-images")


@pytest.fixture
def sandboxd(tmp_path: Path, sandbox_images: Path) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(tmp_path, sandbox_images)
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture
def quota_sandboxd(sandboxd: DaemonFactory) -> Iterator[DaemonFactory]:
    """Daemons started with ``disk_quota = "btrfs"``: their pools (which outlive sandboxd by design) are
    unmounted and their images removed after the test."""
    yield sandboxd
    sandboxd.cleanup()  # the sandboxes' overlays pin the pool until their processes are gone
    for daemon in sandboxd.daemons:
        image, mount = pool_paths(daemon.state_dir)
        for _ in range(50):
            if subprocess.run(["umount", str(mount)], capture_output=True).returncode == 0:
                break
            if subprocess.run(["mountpoint", "-q", str(mount)]).returncode != 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(mount)], check=False)
        with contextlib.suppress(FileNotFoundError):
            image.unlink()


# Namespaces, cgroups and overlayfs need root; elsewhere these tests cannot run (and must not pretend to).
if os.geteuid() != 0:
    collect_ignore_glob = ["test_*.py"]
