"""The new mount API: detached mounts built by the (host-root) supervisor, moved into place by the init
(open_tree, mount_setattr, fsopen/fsconfig/fsmount, move_mount)."""

from __future__ import annotations

import ctypes
import errno
import os

from adx.sandboxd._linux import check, syscall, u64_fields

__all__ = [
    "LOWER_BY_DESCRIPTOR",
    "MOUNT_ATTR_NODEV",
    "MOUNT_ATTR_NOEXEC",
    "MOUNT_ATTR_NOSUID",
    "MOUNT_ATTR_RDONLY",
    "detached_bind",
    "detached_overlay",
    "move_mount",
]

# One syscall number on every architecture for these (they came after the tables were unified).
_NR_OPEN_TREE, _NR_MOVE_MOUNT, _NR_FSOPEN, _NR_FSCONFIG, _NR_FSMOUNT, _NR_MOUNT_SETATTR = 428, 429, 430, 431, 432, 442
_OPEN_TREE_CLONE = 1
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_FSCONFIG_SET_STRING = 1
_FSCONFIG_SET_FD = 5
_FSCONFIG_CMD_CREATE = 6
_MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
_MOUNT_ATTR_IDMAP = 0x100000


class _MountAttr(ctypes.Structure):
    _fields_ = u64_fields("attr_set", "attr_clr", "propagation", "userns_fd")


def detached_bind(path: str, attrs: int = 0, userns_fd: int | None = None, recursive: bool = True) -> int:
    """A detached copy of the mount tree at ``path`` (``open_tree(OPEN_TREE_CLONE)``): its descriptor (CLOEXEC).

    ``attrs`` (MOUNT_ATTR_*) are only ever *added* (a bind remount by mount(2) inside a user namespace must
    repeat every flag the host's mount has locked); with ``userns_fd`` the copy is idmapped through that user
    namespace: a file the filesystem says host uid N owns appears as N mapped into the namespace (host root's
    files are the sandbox root's), and what the sandbox creates through it is stored unmapped.
    """
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | (_AT_RECURSIVE if recursive else 0)
    fd = check(
        syscall(_NR_OPEN_TREE, ctypes.c_int(_AT_FDCWD), os.fsencode(path), ctypes.c_uint(flags)), f"open_tree {path}"
    )
    try:
        if attrs or userns_fd is not None:
            attr = _MountAttr(attrs | (_MOUNT_ATTR_IDMAP if userns_fd is not None else 0), 0, 0, userns_fd or 0)
            at = _AT_EMPTY_PATH | (_AT_RECURSIVE if recursive else 0)
            result = syscall(
                _NR_MOUNT_SETATTR,
                ctypes.c_int(fd),
                b"",
                ctypes.c_uint(at),
                ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr)),
            )
            check(result, f"mount_setattr {path}")
    except BaseException:
        os.close(fd)
        raise
    return fd


#: Whether this kernel takes overlay layers by descriptor (``lowerdir+``, 6.8+); learnt on the first overlay.
#: A one-element list so the fallback can be forced in tests.
LOWER_BY_DESCRIPTOR = [True]


def detached_overlay(
    lower_fds: list[int], upper: str | None, work: str | None, options: dict[str, str], attrs: int
) -> int:
    """An overlay mount, detached (fsopen/fsconfig/fsmount): its descriptor (CLOEXEC).

    Layers are given so that no host path lands in the mount's options (what /proc/mounts shows inside): each
    lower as a descriptor (``lowerdir+``, shown as ``/``: kernel >= 6.8), upper and work dirs as the caller's
    relative paths (shown as given; the caller chdir()s to their parent)."""
    fs = check(syscall(_NR_FSOPEN, b"overlay", ctypes.c_uint(1)), "fsopen overlay")  # FSOPEN_CLOEXEC
    try:

        def config(cmd: int, key: str, value: bytes | None, aux: int) -> None:
            check(
                syscall(_NR_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(cmd), key.encode(), value, ctypes.c_int(aux)),
                f"overlay option {key}",
            )

        if LOWER_BY_DESCRIPTOR[0]:
            try:
                for fd in lower_fds:
                    config(_FSCONFIG_SET_FD, "lowerdir+", None, fd)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                LOWER_BY_DESCRIPTOR[0] = False  # kernel < 6.8: this context is unusable, start again below
                stale, fs = fs, -1
                os.close(stale)
                fs = check(syscall(_NR_FSOPEN, b"overlay", ctypes.c_uint(1)), "fsopen overlay")
        if not LOWER_BY_DESCRIPTOR[0]:
            # Older kernels: the layers by path, through our descriptors (/proc/self/fd/N resolves to the
            # detached mount), so the options still name no host directory.
            lowers = ":".join(f"/proc/self/fd/{fd}" for fd in lower_fds)
            config(_FSCONFIG_SET_STRING, "lowerdir", lowers.encode(), 0)
        if upper is not None and work is not None:  # else read-only (two lowers at least)
            config(_FSCONFIG_SET_STRING, "upperdir", os.fsencode(upper), 0)
            config(_FSCONFIG_SET_STRING, "workdir", os.fsencode(work), 0)
        for key, value in options.items():
            config(_FSCONFIG_SET_STRING, key, value.encode(), 0)
        check(
            syscall(_NR_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(_FSCONFIG_CMD_CREATE), None, None, ctypes.c_int(0)),
            "overlay create",
        )
        return check(syscall(_NR_FSMOUNT, ctypes.c_int(fs), ctypes.c_uint(1), ctypes.c_uint(attrs)), "fsmount overlay")
    finally:
        if fs >= 0:
            os.close(fs)


def move_mount(fd: int, target: str) -> None:
    """Attach the detached mount ``fd`` at ``target`` (in the caller's mount namespace)."""
    result = syscall(
        _NR_MOVE_MOUNT,
        ctypes.c_int(fd),
        b"",
        ctypes.c_int(_AT_FDCWD),
        os.fsencode(target),
        ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
    )
    check(result, f"move_mount to {target}")
