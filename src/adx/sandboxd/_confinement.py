"""What a sandbox's processes may not do: the capabilities they keep and the seccomp filter on the rest."""

from __future__ import annotations

import ctypes
import struct

from adx.sandboxd._linux import MACHINE, check, libc, syscall

__all__ = ["KEEP_CAPABILITIES", "drop_bounding_set", "drop_capabilities", "install_seccomp", "set_dumpable"]

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
    check(libc.prctl(4, 1, 0, 0, 0), "dumpable")


def drop_bounding_set() -> None:
    """Shrink this process's bounding set to KEEP_CAPABILITIES. Its effective and permitted sets are untouched,
    and its children inherit the shrunk set (a supervisor does this before it clones the sandbox's init)."""
    for cap in range(_LAST_CAP + 1):
        if cap not in KEEP_CAPABILITIES:
            check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")


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
    check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    # capget/capset v3: zero the inheritable set (root's is normally empty; make it certain).
    header = struct.pack("Ii", 0x20080522, 0)
    data = ctypes.create_string_buffer(24)
    hdr = ctypes.create_string_buffer(header)
    check(syscall(125 if MACHINE == "x86_64" else 90, hdr, data), "capget")
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
    check(syscall(126 if MACHINE == "x86_64" else 91, hdr, data), "capset")
    if no_new_privs:
        check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


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
    machine = machine or MACHINE
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
_SECCOMP_PROGRAM = seccomp_program() if MACHINE in _SECCOMP_ARCH else b""


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp() -> None:
    """Install the filter on this process (needs no_new_privs, set by drop_capabilities)."""
    if MACHINE not in _SECCOMP_ARCH:
        return  # unknown syscall table: capabilities alone must do
    raw = _SECCOMP_PROGRAM
    buf = ctypes.create_string_buffer(raw, len(raw))
    prog = _SockFprog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p))
    # PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog (an address fits the unsigned long prototype; buf stays alive)
    check(libc.prctl(22, 2, ctypes.addressof(prog), 0, 0), "seccomp")
