"""The sandbox root's overlay on kernels without layers by descriptor (``lowerdir+``, 6.8+; Debian 12 runs 6.1):
the layers go by ``/proc/self/fd/N`` paths of the same detached mounts, so the overlay still works and its
options still name no host directory. Forced here on a newer kernel, on real mounts (we run as root)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from adx.sandboxd import _mount_api as mapi


@pytest.fixture
def by_path() -> Iterator[None]:
    saved = mapi.LOWER_BY_DESCRIPTOR[0]
    mapi.LOWER_BY_DESCRIPTOR[0] = False
    try:
        yield
    finally:
        mapi.LOWER_BY_DESCRIPTOR[0] = saved


@pytest.mark.parametrize("mode", ["descriptor", "path"])
def test_the_overlay_mounts_both_ways_without_host_paths(
    tmp_path: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    if mode == "path":
        request.getfixturevalue("by_path")
    base, top, upper, work, target = (tmp_path / n for n in ("base", "top", "upper", "work", "target"))
    for d in (base, top, upper, work, target):
        d.mkdir()
    (base / "from-base").write_text("base\n")
    (top / "from-top").write_text("top\n")
    lowers = [mapi.detached_bind(str(top), mapi.MOUNT_ATTR_RDONLY, None, recursive=False),
              mapi.detached_bind(str(base), mapi.MOUNT_ATTR_RDONLY, None, recursive=False)]  # fmt: skip
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        overlay = mapi.detached_overlay(lowers, "upper", "work", {"xino": "off", "index": "off"}, 0)
    finally:
        os.chdir(cwd)
        for fd in lowers:
            os.close(fd)
    try:
        mapi.move_mount(overlay, str(target))
    finally:
        os.close(overlay)
    try:
        assert (target / "from-base").read_text() == "base\n" and (target / "from-top").read_text() == "top\n"
        (target / "new").write_text("kept\n")
        assert (upper / "new").read_text() == "kept\n"
        line = next(line for line in Path("/proc/self/mounts").read_text().splitlines() if f" {target} " in line)
        assert str(base) not in line and str(top) not in line and str(upper) not in line, line
        assert ("lowerdir=/proc/self/fd/" in line) == (mode == "path"), line
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)
