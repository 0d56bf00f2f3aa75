"""The three btrfs operations on a create's and a delete's path, as ioctls on this process's descriptors.

``btrfs subvolume create`` and ``btrfs qgroup limit`` are each a fork+exec of btrfs-progs around one ioctl:
~1 ms apiece on a quiet machine, several under load, and one after the other on every cold create with
``disk_quota = "btrfs"`` (docs/performance.md, "sandboxd create"). These make the same ioctls with the same
arguments as btrfs-progs does (``cmds/subvolume.c``, ``cmds/qgroup.c``), from the calling thread.
"""

from __future__ import annotations

import fcntl
import os
import struct

__all__ = ["qgroup_limit", "subvolume_create", "subvolume_delete"]

_MAGIC = 0x94
#: struct btrfs_ioctl_vol_args: __s64 fd; char name[BTRFS_PATH_NAME_MAX + 1] (4088): 4096 bytes.
_VOL_ARGS = 4096
_NAME_MAX = _VOL_ARGS - 8 - 1  # room for the terminating NUL
#: struct btrfs_ioctl_qgroup_limit_args: __u64 qgroupid; struct btrfs_qgroup_limit {flags, max_rfer,
#: max_excl, rsv_rfer, rsv_excl} (all __u64): 48 bytes.
_QGROUP_LIMIT_ARGS = struct.Struct("=QQQQQQ")
_QGROUP_LIMIT_MAX_RFER = 1 << 0


def _iow(nr: int, size: int) -> int:
    return (1 << 30) | (size << 16) | (_MAGIC << 8) | nr


def _ior(nr: int, size: int) -> int:
    return (2 << 30) | (size << 16) | (_MAGIC << 8) | nr


_IOC_SUBVOL_CREATE = _iow(14, _VOL_ARGS)
_IOC_SNAP_DESTROY = _iow(15, _VOL_ARGS)
_IOC_QGROUP_LIMIT = _ior(43, _QGROUP_LIMIT_ARGS.size)  # _IOR in the kernel's header, though it only reads


def _vol_args(name: str) -> bytearray:
    raw = name.encode()
    if not raw or b"/" in raw or len(raw) > _NAME_MAX:
        raise ValueError(f"not a subvolume name: {name!r}")
    # Mutable: fcntl.ioctl copies an immutable argument into a 1024-byte buffer, too small for this struct.
    buf = bytearray(_VOL_ARGS)
    buf[8 : 8 + len(raw)] = raw
    return buf


def _on_parent(path: str, request: int) -> None:
    parent, name = os.path.split(os.path.abspath(path))
    args = _vol_args(name)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, request, args, True)
    finally:
        os.close(fd)


def subvolume_create(path: str) -> None:
    """``btrfs subvolume create PATH``: OSError as the kernel answers (EEXIST, ENOTTY off btrfs, ...). With
    quotas enabled the kernel gives the new subvolume its level-0 qgroup in the same transaction."""
    _on_parent(path, _IOC_SUBVOL_CREATE)


def subvolume_delete(path: str) -> None:
    """``btrfs subvolume delete PATH`` (without waiting for the cleaner, as btrfs-progs' default): EINVAL when
    ``PATH`` is a plain directory, not a subvolume."""
    _on_parent(path, _IOC_SNAP_DESTROY)


def qgroup_limit(path: str, max_referenced: int) -> None:
    """``btrfs qgroup limit MAX PATH``: the referenced-bytes limit of the qgroup of the subvolume holding
    ``PATH`` (qgroup ID 0 tells the kernel to take that subvolume's)."""
    args = bytearray(_QGROUP_LIMIT_ARGS.pack(0, _QGROUP_LIMIT_MAX_RFER, max_referenced, 0, 0, 0))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _IOC_QGROUP_LIMIT, args, True)
    finally:
        os.close(fd)
