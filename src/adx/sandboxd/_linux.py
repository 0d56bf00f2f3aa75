"""Thin ctypes bindings for the Linux calls the sandbox needs and the stdlib lacks: libc itself, clone3 and the
namespace flags, classic mount(2)/pivot_root, and the calls that set a process's identity (ID maps, host name;
argv and environ are ``adx.execd._process_args``'). Beside it, one module a kind of call: ``_mount_api``
(detached mounts), ``_confinement`` (capabilities and seccomp), ``_netif`` (interfaces and routes) and
``_unix_sockets``.

Only the spawner and supervisor (single-threaded processes) call ``clone3``; the daemon never does.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

__all__ = [
    "CLONE_INTO_CGROUP",
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "CLONE_NEWUTS",
    "MNT_DETACH",
    "MS_BIND",
    "MS_NODEV",
    "MS_NOEXEC",
    "MS_NOSUID",
    "MS_PRIVATE",
    "MS_RDONLY",
    "MS_REC",
    "MS_REMOUNT",
    "clone3",
    "mount",
    "pivot_root",
    "rename_noreplace",
    "sethostname",
    "sethostname_of",
    "umount2",
    "write_id_maps",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_INTO_CGROUP = 0x200000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

_SYSCALLS = {
    # (clone3, pivot_root): clone3 uses the generic number everywhere; pivot_root differs on x86_64.
    "x86_64": (435, 155),
    "aarch64": (435, 41),
}

#: ``platform.machine()`` without importing platform (it costs every in-process execd PID 1 ~0.13 MiB).
MACHINE = os.uname().machine

# The process's own symbols (libc is among them) rather than ctypes.util.find_library: that pulls in shutil,
# subprocess and re (~0.4 MiB) into the spawner and every supervisor, and into PID 1 when execd runs in process.
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


def _nr(index: int) -> int:
    try:
        return _SYSCALLS[MACHINE][index]
    except KeyError:
        raise OSError(f"unsupported architecture {MACHINE}") from None


def check(result: int, what: str) -> int:
    """``result`` of a libc call, or the OSError its errno names (every binding of these modules checks this way)."""
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def syscall(nr: int, *args: Any) -> int:
    """syscall(2) by number: for calls libc has no wrapper for."""
    return int(libc.syscall(ctypes.c_long(nr), *args))


def u64_fields(*names: str) -> list[tuple[str, type[ctypes.c_uint64]]]:
    """The ``_fields_`` of a kernel struct whose every member is a ``__aligned_u64`` (clone_args, mount_attr)."""
    return [(name, ctypes.c_uint64) for name in names]


def rename_noreplace(old: str, new: str) -> None:
    """rename(2) that fails with FileExistsError when ``new`` exists, even as an empty directory."""
    # renameat2(AT_FDCWD, old, AT_FDCWD, new, RENAME_NOREPLACE)
    check(libc.renameat2(-100, os.fsencode(old), -100, os.fsencode(new), 1), f"rename {old} -> {new}")


class _CloneArgs(ctypes.Structure):
    _fields_ = u64_fields(
        "flags",
        "pidfd",
        "child_tid",
        "parent_tid",
        "exit_signal",
        "stack",
        "stack_size",
        "tls",
        "set_tid",
        "set_tid_size",
        "cgroup",
    )


def clone3(flags: int, cgroup_fd: int | None = None) -> int:
    """fork-like clone3: returns 0 in the child, the child's PID in the parent.

    The child is a copy of a *single-threaded* caller (never call this from a threaded process: the copy
    would hold whatever locks other threads held). ``cgroup_fd`` (a cgroup2 directory) places the child
    into that cgroup atomically, so not a single instruction of the workload runs outside it.
    """
    args = _CloneArgs()
    args.flags = flags
    args.exit_signal = 17  # SIGCHLD, so waitpid() works as for fork()
    if cgroup_fd is not None:
        args.flags |= CLONE_INTO_CGROUP
        args.cgroup = cgroup_fd
    return check(syscall(_nr(0), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args))), "clone3")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = libc.mount(
        source.encode() if source is not None else None,
        target.encode(),
        fstype.encode() if fstype is not None else None,
        flags,
        data.encode() if data is not None else None,
    )
    check(result, f"mount {source} on {target}")


def write_id_maps(pid: int, base: int, size: int) -> None:
    """Map uids and gids 0..size-1 of ``pid``'s (fresh) user namespace to host ``base``.. (each map is written
    once, by a process privileged in the parent namespace: sandboxd's supervisor)."""
    line = f"0 {base} {size}\n".encode()
    for name in ("uid_map", "gid_map"):
        fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def umount2(target: str, flags: int) -> None:
    check(libc.umount2(target.encode(), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    check(syscall(_nr(1), new_root.encode(), put_old.encode()), "pivot_root")


def sethostname(name: str) -> None:
    raw = name.encode()
    check(libc.sethostname(raw, len(raw)), "sethostname")


def sethostname_of(pid: int, name: str) -> None:
    """Set the host name of ``pid``'s UTS namespace from outside it (this thread joins it for the call, then
    returns to its own): for a process that no longer may (its capabilities are dropped)."""
    own = os.open("/proc/thread-self/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(f"/proc/{pid}/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
        try:
            check(libc.setns(target, CLONE_NEWUTS), "setns")
        finally:
            os.close(target)
        try:
            sethostname(name)
        finally:
            check(libc.setns(own, CLONE_NEWUTS), "setns back")
    finally:
        os.close(own)
