"""Thin ctypes bindings for the Linux calls the sandbox needs and the stdlib lacks.

Only the spawner and supervisor (single-threaded processes) call ``clone3``; the daemon never does.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno

# Imported here, not lazily: a module first imported in a freshly cloned sandbox child costs milliseconds.
import fcntl
import os
import socket
import struct
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
    "add_default_route",
    "bind_unix",
    "clone3",
    "configure_interface",
    "detached_bind",
    "detached_overlay",
    "drop_bounding_set",
    "drop_capabilities",
    "install_seccomp",
    "listen_unix",
    "mount",
    "move_mount",
    "peer_credentials",
    "pivot_root",
    "set_dumpable",
    "set_loopback_up",
    "set_process_args",
    "sethostname",
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
_MACHINE = os.uname().machine

# The process's own symbols (libc is among them) rather than ctypes.util.find_library: that pulls in shutil,
# subprocess and re (~0.4 MiB) into the spawner and every supervisor, and into PID 1 when execd runs in process.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _nr(index: int) -> int:
    try:
        return _SYSCALLS[_MACHINE][index]
    except KeyError:
        raise OSError(f"unsupported architecture {_MACHINE}") from None


def rename_noreplace(old: str, new: str) -> None:
    """rename(2) that fails with FileExistsError when ``new`` exists, even as an empty directory."""
    # renameat2(AT_FDCWD, old, AT_FDCWD, new, RENAME_NOREPLACE)
    _check(_libc.renameat2(-100, os.fsencode(old), -100, os.fsencode(new), 1), f"rename {old} -> {new}")


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


class _CloneArgs(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("pidfd", ctypes.c_uint64),
        ("child_tid", ctypes.c_uint64),
        ("parent_tid", ctypes.c_uint64),
        ("exit_signal", ctypes.c_uint64),
        ("stack", ctypes.c_uint64),
        ("stack_size", ctypes.c_uint64),
        ("tls", ctypes.c_uint64),
        ("set_tid", ctypes.c_uint64),
        ("set_tid_size", ctypes.c_uint64),
        ("cgroup", ctypes.c_uint64),
    ]


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
    pid = _libc.syscall(ctypes.c_long(_nr(0)), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
    return _check(pid, "clone3")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(
        source.encode() if source is not None else None,
        target.encode(),
        fstype.encode() if fstype is not None else None,
        flags,
        data.encode() if data is not None else None,
    )
    _check(result, f"mount {source} on {target}")


# -- the new mount API: detached mounts built by the (host-root) supervisor, moved into place by the init ----------
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
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _sys(nr: int, *args: Any) -> int:
    return int(_libc.syscall(ctypes.c_long(nr), *args))


def detached_bind(path: str, attrs: int = 0, userns_fd: int | None = None, recursive: bool = True) -> int:
    """A detached copy of the mount tree at ``path`` (``open_tree(OPEN_TREE_CLONE)``): its descriptor (CLOEXEC).

    ``attrs`` (MOUNT_ATTR_*) are only ever *added* (a bind remount by mount(2) inside a user namespace must
    repeat every flag the host's mount has locked); with ``userns_fd`` the copy is idmapped through that user
    namespace: a file the filesystem says host uid N owns appears as N mapped into the namespace (host root's
    files are the sandbox root's), and what the sandbox creates through it is stored unmapped.
    """
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | (_AT_RECURSIVE if recursive else 0)
    fd = _check(
        _sys(_NR_OPEN_TREE, ctypes.c_int(_AT_FDCWD), os.fsencode(path), ctypes.c_uint(flags)), f"open_tree {path}"
    )
    try:
        if attrs or userns_fd is not None:
            attr = _MountAttr(attrs | (_MOUNT_ATTR_IDMAP if userns_fd is not None else 0), 0, 0, userns_fd or 0)
            at = _AT_EMPTY_PATH | (_AT_RECURSIVE if recursive else 0)
            result = _sys(
                _NR_MOUNT_SETATTR,
                ctypes.c_int(fd),
                b"",
                ctypes.c_uint(at),
                ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr)),
            )
            _check(result, f"mount_setattr {path}")
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
    fs = _check(_sys(_NR_FSOPEN, b"overlay", ctypes.c_uint(1)), "fsopen overlay")  # FSOPEN_CLOEXEC
    try:

        def config(cmd: int, key: str, value: bytes | None, aux: int) -> None:
            _check(
                _sys(_NR_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(cmd), key.encode(), value, ctypes.c_int(aux)),
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
                fs = _check(_sys(_NR_FSOPEN, b"overlay", ctypes.c_uint(1)), "fsopen overlay")
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
        _check(
            _sys(_NR_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(_FSCONFIG_CMD_CREATE), None, None, ctypes.c_int(0)),
            "overlay create",
        )
        return _check(_sys(_NR_FSMOUNT, ctypes.c_int(fs), ctypes.c_uint(1), ctypes.c_uint(attrs)), "fsmount overlay")
    finally:
        if fs >= 0:
            os.close(fs)


def move_mount(fd: int, target: str) -> None:
    """Attach the detached mount ``fd`` at ``target`` (in the caller's mount namespace)."""
    result = _sys(
        _NR_MOVE_MOUNT,
        ctypes.c_int(fd),
        b"",
        ctypes.c_int(_AT_FDCWD),
        os.fsencode(target),
        ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
    )
    _check(result, f"move_mount to {target}")


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
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    result = _libc.syscall(ctypes.c_long(_nr(1)), new_root.encode(), put_old.encode())
    _check(result, "pivot_root")


def set_process_args(argv: list[str], env: dict[str, str]) -> None:
    """Rewrite this process's argv and environ areas in place (as setproctitle does), so that
    ``/proc/self/cmdline`` and ``environ`` show ``argv`` and ``env`` as after an execve of them.

    For a process that becomes another program without exec. The areas keep their size (moving them needs
    CAP_SYS_RESOURCE, which containers often lack): what does not fit is left out at an item boundary and the
    rest of each area is NUL, so a reader splitting on NUL sees trailing empty items.
    """
    with open("/proc/self/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])  # stat fields 48..51
    for start, end, items in (
        (arg_start, arg_end, argv),
        (env_start, env_end, [f"{k}={v}" for k, v in env.items()]),
    ):
        size, raw = end - start, b""
        for item in items:
            encoded = item.encode() + b"\0"
            if len(raw) + len(encoded) > size:
                break
            raw += encoded
        ctypes.memmove(start, raw.ljust(size, b"\0"), size)


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, len(raw)), "sethostname")


# Capabilities kept inside a sandbox (Docker's default set minus MKNOD and NET_RAW). Everything else —
# SYS_ADMIN (mount, escape via new mounts), DAC_READ_SEARCH (open_by_handle_at escapes), SYS_MODULE,
# SYS_PTRACE, NET_ADMIN (the host network when sharing it), ... — is removed from the bounding set so no
# exec inside the sandbox can regain it.
KEEP_CAPABILITIES = frozenset(
    {
        0,  # CHOWN
        1,  # DAC_OVERRIDE
        3,  # FOWNER
        4,  # FSETID
        5,  # KILL
        6,  # SETGID
        7,  # SETUID
        8,  # SETPCAP
        10,  # NET_BIND_SERVICE
        18,  # SYS_CHROOT
        29,  # AUDIT_WRITE
        31,  # SETFCAP
    }
)
# Read once at import (in the spawner), not in every freshly cloned sandbox child.
with open("/proc/sys/kernel/cap_last_cap") as _fh:
    _LAST_CAP = int(_fh.read())
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


def set_dumpable() -> None:
    """PR_SET_DUMPABLE 1: a uid change (the init becoming its user namespace's root) made this process
    non-dumpable, which makes its /proc files host root's; an execve would reset it, an in-process execd has none.
    """
    _check(_libc.prctl(4, 1, 0, 0, 0), "dumpable")


def drop_bounding_set() -> None:
    """Shrink this process's bounding set to KEEP_CAPABILITIES. Its effective and permitted sets are untouched,
    and its children inherit the shrunk set (a supervisor does this before it clones the sandbox's init)."""
    for cap in range(_LAST_CAP + 1):
        if cap not in KEEP_CAPABILITIES:
            _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")


def _bounding_set_dropped() -> bool:
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"CapBnd:"):
                return int(line.split()[1], 16) & ~sum(1 << cap for cap in KEEP_CAPABILITIES) == 0
    return False


def drop_capabilities(*, no_new_privs: bool = True) -> None:
    """Shrink the bounding set to KEEP_CAPABILITIES (unless that is done: one read), clear ambient/inheritable,
    set no_new_privs (``no_new_privs=False``: setuid programs such as sudo work; the seccomp filter must then be
    installed before, while CAP_SYS_ADMIN is still held)."""
    if not _bounding_set_dropped():
        drop_bounding_set()
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    # capget/capset v3: zero the inheritable set (root's is normally empty; make it certain).
    header = struct.pack("Ii", 0x20080522, 0)
    data = ctypes.create_string_buffer(24)
    hdr = ctypes.create_string_buffer(header)
    _check(_libc.syscall(ctypes.c_long(125 if _MACHINE == "x86_64" else 90), hdr, data), "capget")
    values = list(struct.unpack("6I", data.raw))
    keep_mask = sum(1 << cap for cap in KEEP_CAPABILITIES)
    for word in (0, 1):
        base = 3 * word
        mask = (keep_mask >> (32 * word)) & 0xFFFFFFFF
        values[base] &= mask  # effective
        values[base + 1] &= mask  # permitted
        values[base + 2] = 0  # inheritable
    data = ctypes.create_string_buffer(struct.pack("6I", *values))
    hdr = ctypes.create_string_buffer(header)
    _check(_libc.syscall(ctypes.c_long(126 if _MACHINE == "x86_64" else 91), hdr, data), "capset")
    if no_new_privs:
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def set_loopback_up() -> None:
    """Bring ``lo`` up in a fresh network namespace (SIOCGIFFLAGS/SIOCSIFFLAGS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, 0x8913, ifreq))[1]
        ifreq = struct.pack("16sH14s", b"lo", flags | 0x1, b"")  # IFF_UP
        fcntl.ioctl(sock, 0x8914, ifreq)


# -- seccomp -------------------------------------------------------------------------------------------------
# Kept with user namespaces on (sandboxd's user_namespace): the sandbox's namespace is cloned by its supervisor
# before this filter exists, and its root must still not reach the kernel surface a namespace of its own would
# open. Without one (user_namespace = "off") the sandbox's root is host uid 0. Capabilities stop mount, reboot,
# raw I/O...; this filter closes what capabilities do not: the uid-0 kernel keyring (keyctl/add_key/
# request_key, shared with the host's root), new user namespaces (full capabilities inside a fresh userns,
# a large kernel attack surface), unprivileged bpf/perf/userfaultfd, and the new mount API. clone3 gets
# ENOSYS (its flags live in memory a filter cannot read), so libc falls back to clone, whose flags it can.
_SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENY = {
    # name: (x86_64, aarch64)
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "open_by_handle_at": (304, 265),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "acct": (163, 89),
    "setns": (308, 268),
    "quotactl": (179, 60),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
}
_UNSHARE = (272, 97)
_CLONE = (56, 220)
_CLONE3 = 435
_CLONE_NEWUSER = 0x10000000
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | 1
_RET_ENOSYS = 0x00050000 | 38


def _bpf(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter as raw ``sock_filter`` instructions (exposed for tests)."""
    machine = machine or _MACHINE
    col = 0 if machine == "x86_64" else 1
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog = [
        _bpf(ld, 4),  # seccomp_data.arch
        _bpf(jeq, _SECCOMP_ARCH[machine], jt=1),
        _bpf(ret, _RET_EPERM),  # a foreign ABI (e.g. 32-bit) is not allowed at all
        _bpf(ld, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        prog += [_bpf(jge, 0x40000000, jf=1), _bpf(ret, _RET_EPERM)]  # x32 ABI numbers
    for numbers in _DENY.values():
        prog += [_bpf(jeq, numbers[col], jf=1), _bpf(ret, _RET_EPERM)]
    prog += [_bpf(jeq, _CLONE3, jf=1), _bpf(ret, _RET_ENOSYS)]
    prog += [
        _bpf(jeq, _UNSHARE[col], jt=1),
        _bpf(jeq, _CLONE[col], jf=3),
        _bpf(ld, 16),  # low 32 bits of args[0]: the flags of unshare() and clone()
        _bpf(jset, _CLONE_NEWUSER, jf=1),
        _bpf(ret, _RET_EPERM),
        _bpf(ret, _RET_ALLOW),
    ]
    return b"".join(prog)


# Built once at import (in the spawner), not in every sandbox child.
_SECCOMP_PROGRAM = seccomp_program() if _MACHINE in _SECCOMP_ARCH else b""


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp() -> None:
    """Install the filter on this process (needs no_new_privs, set by drop_capabilities)."""
    if _MACHINE not in _SECCOMP_ARCH:
        return  # unknown syscall table: capabilities alone must do
    raw = _SECCOMP_PROGRAM
    buf = ctypes.create_string_buffer(raw, len(raw))
    prog = _SockFprog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p))
    # PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog (an address fits the unsigned long prototype; buf stays alive)
    _check(_libc.prctl(22, 2, ctypes.addressof(prog), 0, 0), "seccomp")


def configure_interface(name: str, address: str, prefix: int) -> None:
    """Give ``name`` an IPv4 address/prefix and bring it up (SIOCSIFADDR, SIOCSIFNETMASK, SIOCSIFFLAGS)."""
    mask = (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for request, raw in ((0x8916, socket.inet_aton(address)), (0x891C, struct.pack("!I", mask))):
            ifreq = struct.pack("16sH2s4s8s", name.encode(), socket.AF_INET, b"", raw, b"")
            fcntl.ioctl(sock, request, ifreq)
        ifreq = struct.pack("16sH14s", name.encode(), 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, 0x8913, ifreq))[1]
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14s", name.encode(), flags | 0x1, b""))


def add_default_route(gateway: str) -> None:
    """Route everything through ``gateway`` (SIOCADDRT with RTF_UP|RTF_GATEWAY): the veth's host end, which
    forwards (and NATs) what the node's egress policy lets through."""

    def sockaddr(addr: bytes) -> bytes:
        return struct.pack("=HH4s8s", socket.AF_INET, 0, addr, b"")

    zero = socket.inet_aton("0.0.0.0")
    # struct rtentry, native layout: pad1, dst, gateway, genmask, flags, pad2, pad3, pad4, metric, dev, mtu,
    # window, irtt.
    rtentry = struct.pack(
        "@L16s16s16sHhLPhPLLH",
        0,
        sockaddr(zero),
        sockaddr(socket.inet_aton(gateway)),
        sockaddr(zero),
        0x1 | 0x2,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, 0x890B, rtentry)


def peer_credentials(sock: Any) -> tuple[int, int, int]:
    """(pid, uid, gid) of the peer of a connected Unix socket, as recorded by the kernel at connect().

    ``sock`` is a socket or asyncio's TransportSocket wrapper (both have ``getsockopt``).
    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def bind_unix(path: str, mode: int = 0o600) -> socket.socket:
    """A bound (not yet listening) Unix stream socket at ``path`` (replacing a stale file), CLOEXEC.

    The parent must be a real directory that only the host can write to. The mode is set on the socket before
    ``bind`` (Linux applies it to the new file): nothing is changed by path afterwards. Binding through an
    ``O_PATH`` descriptor of the directory lifts ``sun_path``'s 108-byte limit.
    """
    parent, name = os.path.split(path)
    dir_fd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        os.fchmod(sock.fileno(), mode)
        sock.bind(f"/proc/self/fd/{dir_fd}/{name}")
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(dir_fd)
    return sock


def listen_unix(path: str, mode: int = 0o600, backlog: int = 512) -> int:
    """A listening Unix stream socket at ``path`` (``bind_unix``); returns its descriptor."""
    with bind_unix(path, mode) as sock:  # closed if listen fails; a detached socket's close is a no-op
        sock.listen(backlog)
        return sock.detach()
