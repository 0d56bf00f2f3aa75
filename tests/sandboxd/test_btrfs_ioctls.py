"""The writable layer's subvolume, its qgroup limit and its deletion are made by ioctls (``_btrfs``) instead of
btrfs-progs processes (issue 13: two fork+execs off every cold create). btrfs-progs itself must see exactly
what its own commands would have made: a subvolume, a level-0 qgroup whose referenced limit is the sandbox's
disk, and nothing left after a delete; a write past the limit fails."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from adx.errors import UnavailableError
from adx.sandboxd import _btrfs
from adx.sandboxd._storage import StoragePool, pool_paths

pytestmark = pytest.mark.skipif(shutil.which("mkfs.btrfs") is None, reason="needs btrfs-progs")

MiB = 1 << 20


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[StoragePool]:
    image, mount = pool_paths(tmp_path / "state")
    p = StoragePool(image, mount, 1 << 30)
    p.ensure()
    try:
        yield p
    finally:
        with contextlib.suppress(UnavailableError):
            p.unmount()


def _btrfs_cli(*argv: str) -> str:
    return subprocess.run(["btrfs", *argv], capture_output=True, text=True, check=True).stdout


def _limit_of(pool: StoragePool, sub: Path) -> int:
    """The max referenced bytes btrfs-progs reports for the subvolume's level-0 qgroup."""
    subvolume_id = next(
        int(line.split(":", 1)[1])
        for line in _btrfs_cli("subvolume", "show", str(sub)).splitlines()
        if line.strip().startswith("Subvolume ID:")
    )
    for line in _btrfs_cli("qgroup", "show", "-r", "--raw", str(pool.mount)).splitlines():
        fields = line.split()
        if fields and fields[0] == f"0/{subvolume_id}":
            return int(fields[3])
    raise AssertionError(f"no qgroup 0/{subvolume_id}")


@pytest.mark.req("SEC-3")
def test_a_layer_made_by_ioctls_is_a_limited_subvolume_as_btrfs_progs_sees_it(pool: StoragePool) -> None:
    sub = pool.create("sb-one", 8 * MiB)
    assert "Subvolume ID:" in _btrfs_cli("subvolume", "show", str(sub))
    assert _limit_of(pool, sub) == 8 * MiB
    assert (sub / "upper").is_dir() and (sub / "ovlwork").is_dir()
    with pytest.raises(OSError) as exc, open(sub / "upper" / "big", "wb") as f:
        for _ in range(32):
            f.write(b"\0" * MiB)
            f.flush()
        os.fsync(f.fileno())
    assert exc.value.errno in (errno.EDQUOT, errno.ENOSPC)
    # A leftover of the same name is replaced, with the new limit.
    sub = pool.create("sb-one", 16 * MiB)
    assert _limit_of(pool, sub) == 16 * MiB and not (sub / "upper" / "big").exists()
    pool.delete("sb-one")
    assert not sub.exists()
    assert "sb-one" not in _btrfs_cli("subvolume", "list", str(pool.mount))


def test_a_plain_directory_is_deleted_as_before_and_kernel_refusals_name_the_operation(pool: StoragePool) -> None:
    plain = pool.subvolume("sb-plain")
    (plain / "upper").mkdir(parents=True)
    pool.delete("sb-plain")  # not a subvolume (a half-made create): removed as a plain directory
    assert not plain.exists()
    with pytest.raises(OSError) as exc:
        _btrfs.subvolume_create(str(pool.mount / "sbx" / "missing-parent" / "x"))
    assert exc.value.errno == errno.ENOENT
    with pytest.raises(ValueError, match="not a subvolume name"):
        _btrfs.subvolume_create(str(pool.mount / "sbx" / ("x" * 5000)))


def test_a_layer_off_btrfs_is_refused_naming_the_operation(tmp_path: Path) -> None:
    not_btrfs = StoragePool(tmp_path / "img", tmp_path, 1 << 30)  # the test's own dir: ext4 or tmpfs, no ioctl
    (tmp_path / "sbx").mkdir()
    with pytest.raises(UnavailableError, match=r"btrfs subvolume create .*/sbx/sb-x failed: .*"):
        not_btrfs.create("sb-x", MiB)
    assert not (tmp_path / "sbx" / "sb-x").exists()
