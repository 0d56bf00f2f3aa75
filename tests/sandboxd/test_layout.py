"""Cgroup layout detection (pure parsing of mountinfo): hybrid, v2-only and v1-only hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from adx.sandboxd._cgroups import SandboxCgroup, detect_layout

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 31 0:36 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
40 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_ONLY = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
V1_COMBINED = """\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 31 0:36 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
"""


@pytest.mark.req("SBX-5")
def test_hybrid_layout_uses_v1_for_limits_and_cgroup2_for_identity() -> None:
    layout = detect_layout(HYBRID)
    assert layout.v2_root == Path("/sys/fs/cgroup/unified")
    assert {c: layout.source(c) for c in ("memory", "cpu", "pids")} == {"memory": "v1", "cpu": "v1", "pids": "v1"}
    cg = SandboxCgroup(layout, "adx", "sb-1")
    assert cg.identity_dir() == Path("/sys/fs/cgroup/unified/adx/sb-1")
    assert set(cg.v1_dirs) == {"memory", "cpu", "cpuacct", "pids"}  # no v1 freezer: cgroup2 freezes and kills


def test_v2_only_layout_needs_the_controllers_enabled_in_cgroup2() -> None:
    layout = detect_layout(V2_ONLY)
    assert layout.v2_root == Path("/sys/fs/cgroup") and not layout.v1_mounts
    # This host has no cgroup2 at /sys/fs/cgroup, so no controllers are read: all three are missing, and
    # sandboxd refuses to start rather than run sandboxes without limits.
    if not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        assert layout.missing() == ["memory", "cpu", "pids"]


def test_v1_only_layout_uses_the_memory_dir_for_identity_and_the_freezer_for_kill() -> None:
    layout = detect_layout(V1_COMBINED)
    assert layout.v2_root is None
    cg = SandboxCgroup(layout, "adx", "sb-1")
    assert cg.identity_dir() == Path("/sys/fs/cgroup/memory/adx/sb-1")
    assert cg.v1_dirs["cpu"] == cg.v1_dirs["cpuacct"] == "/sys/fs/cgroup/cpu,cpuacct/adx/sb-1"
    assert "freezer" in cg.v1_dirs
    assert len(cg.dirs()) == 4  # co-mounted cpu,cpuacct share one directory
