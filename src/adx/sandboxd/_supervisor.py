"""The per-sandbox supervisor and the in-namespace setup of the workload.

A supervisor is forked (twice, so it is re-parented away from the spawner) by the single-threaded spawner.
It outlives sandboxd restarts and from the record's commit on holds the sandbox's exclusive lifecycle lock
(``lifecycle.lock``). Before that it prepares what runs no workload code: the cgroup, and the init in its
namespaces (cloned by the idle zygote, ``prepare_init``, or now) and cgroups, mounting its root and then
waiting. Under the lock it refuses to start when a
delete intent is persisted (SBX-7), the record is not a committed ``creating`` one, or the sandbox was started
before (IDs are never restarted, SBX-5) — killing that init and removing the cgroup — and otherwise persists
the native identity (boot ID + cgroup inode) *before* letting the init exec the workload, then waits for it
and durably records how it ended (exit code / signal / OOM) in ``exit.json``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, NoReturn

from adx._fs import fsync_dir
from adx.sandboxd import _linux as lx
from adx.sandboxd._cgroups import CgroupLayout, SandboxCgroup
from adx.sandboxd._output import finish_pump, open_write_ends, start_pump

__all__ = [
    "CONTROL_DIR_INSIDE",
    "EXECD_ADMIN_SOCKET_FD",
    "EXECD_SOCKET_FD",
    "EXECD_SOCKET_NAMES",
    "EXIT_FILE",
    "LOCK_FILE",
    "NATIVE_FILE",
    "run_supervisor",
]

LOCK_FILE = "lifecycle.lock"
NATIVE_FILE = "native.json"
EXIT_FILE = "exit.json"
RECORD_FILE = "record.json"
TOMBSTONE_FILE = "tombstone.json"
NATIVE_TEMP = f".{NATIVE_FILE}.tmp"
SUPERVISOR_LOG = "supervisor.log"
OUTPUT_LOG = "output.log"

_DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


#: Read once, in the spawner before it forks (a boot's ID never changes): not a file read per create.
_BOOT_ID = boot_id()


#: execd sandboxes: the listening client and admin sockets are PID 1's descriptors 3 and 4 (socket activation).
EXECD_SOCKET_FD = 3
EXECD_ADMIN_SOCKET_FD = 4
EXECD_SOCKET_NAMES = ("execd.sock", "execd-admin.sock")
#: execd sandboxes: sandboxd's per-sandbox control socket dir, mounted read-only here inside.
CONTROL_DIR_INSIDE = "/run/adx-control"


def _in_namespace_setup(
    spec: dict[str, Any],
    log_fds: tuple[int, int],
    err_fd: int,
    go_fd: int,
    mounts_fd: int,
    listen_fds: tuple[int, ...] = (),
    prepared: bool = False,
) -> None:
    """Runs in the cloned child (PID 1 of the new PID namespace); ends in execve or _exit.

    ``prepared``: this child was cloned before its spec existed (:func:`prepare_init`), which made its mounts
    private and brought ``lo`` up already.

    ``mounts_fd``: the supervisor sends the sandbox's root and host binds here, built as detached mounts
    (:func:`_build_mounts`: idmapped for a user namespace, whose ID maps it wrote first; no host path in their
    options). We become the namespace's root (a host ID of the sandbox's range) and move them into place.

    ``listen_fds`` (execd sandboxes): listening sockets bound by the supervisor at host-only paths; they become
    descriptors 3, 4, ... of the exec'd init, which only accepts on them.

    ``go_fd``: the supervisor writes one byte once the record is committed, the identity persisted, we are in
    the v1 limit hierarchies and (veth mode) our network device exists. We do our mounts meanwhile and wait
    for it at the first point that needs it — before configuring eth0, or at the latest before exec — so no
    workload code runs uncommitted or unlimited.
    """
    waited = False

    def wait_go() -> None:
        nonlocal waited
        if not waited:
            waited = True
            if os.read(go_fd, 1) != b"1":
                raise OSError("the supervisor could not place the sandbox in its cgroups or network")
            os.close(go_fd)

    try:
        sdir = spec["sandbox_dir"]
        root = f"{sdir}/rootfs"
        userns = spec.get("userns") is not None
        if not prepared:
            # Nothing we mount may propagate back to the host's mount namespace.
            lx.mount(None, "/", None, lx.MS_REC | lx.MS_PRIVATE)
        fds = _receive_mounts(mounts_fd)
        # The root first, while we are still host uid 0 (the sandbox dir's path is host root's, mode 0700);
        # then everything relative to it, from inside it.
        lx.move_mount(fds[0], root)
        os.close(fds[0])
        os.chdir(root)
        root = "."
        if userns:
            # The maps are written (before the mounts were sent): from here on we are the namespace's root, a
            # host ID of the sandbox's range, with capabilities only over what that namespace owns.
            os.setresgid(0, 0, 0)
            os.setgroups([])
            os.setresuid(0, 0, 0)
            lx.set_dumpable()
        for (target, _, _), fd in zip(_mount_plan(spec)[1:], fds[1:], strict=True):
            path = f"{root}{target}"
            os.makedirs(path, exist_ok=True)  # a missing mount point lands in the upper layer (an empty dir)
            lx.move_mount(fd, path)
            os.close(fd)
        lx.mount("proc", f"{root}/proc", "proc", lx.MS_NOSUID | lx.MS_NODEV | lx.MS_NOEXEC)
        _harden_proc(f"{root}/proc")
        dev = f"{root}/dev"
        lx.mount("tmpfs", dev, "tmpfs", lx.MS_NOSUID | lx.MS_NOEXEC, "mode=755,size=256k")
        for name, (major, minor) in _DEVICES.items():
            if userns:
                # No device node can be made in a user namespace: the host's, bound.
                os.close(os.open(f"{dev}/{name}", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))
                lx.mount(f"/dev/{name}", f"{dev}/{name}", None, lx.MS_BIND)
            else:
                # mknod (CAP_MKNOD is still held here) is cheaper than a bind mount per node.
                os.mknod(f"{dev}/{name}", 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                os.chmod(f"{dev}/{name}", 0o666)
        os.mkdir(f"{dev}/pts")
        os.mkdir(f"{dev}/shm", 0o1777)
        lx.mount("devpts", f"{dev}/pts", "devpts", lx.MS_NOSUID | lx.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
        lx.mount("shm", f"{dev}/shm", "tmpfs", lx.MS_NOSUID | lx.MS_NODEV, "mode=1777,size=64m")
        os.symlink("pts/ptmx", f"{dev}/ptmx")
        os.symlink("/proc/self/fd", f"{dev}/fd")
        for i, name in enumerate(("stdin", "stdout", "stderr")):
            os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")
        # /tmp and /var/tmp are plain directories of the overlay (the image makes them 1777): their files live in
        # the sandbox's upper layer, so a checkpoint keeps them like /work's. A tmpfs here lost them on pause.
        if spec["network"] in ("none", "veth") and not prepared:
            lx.set_loopback_up()
        if spec["network"] == "veth":
            wait_go()  # the supervisor moves our end of the veth pair into this namespace first
            veth = spec["veth"]
            lx.configure_interface("eth0", veth["sandbox_ip"], veth["prefix"])
            lx.add_default_route(veth["host_ip"])  # egress goes through the node (nftables policy + NAT)
        lx.sethostname(spec["hostname"])
        # pivot_root(".", ".") stacks the old root under the new one; detaching it leaves no path back.
        lx.pivot_root(".", ".")
        lx.umount2(".", lx.MNT_DETACH)
        os.chdir("/")
        os.chdir(spec["cwd"])
        argv = spec["init_argv"]
        in_process = bool(spec.get("execd_inproc")) and argv[1:3] == ["-m", "adx.execd"]
        if in_process:
            lx.set_process_args(argv, spec["env"])
        if spec.get("allow_setuid"):
            # Store images (E2B-like: ``sudo``): no no_new_privs, so setuid programs work; what they gain is
            # bounded by the same trimmed capability set. Seccomp goes first: without no_new_privs installing
            # it needs CAP_SYS_ADMIN, which the drop removes (the filter allows prctl and capset).
            lx.install_seccomp()
            lx.drop_capabilities(no_new_privs=False)
        else:
            lx.drop_capabilities()
            lx.install_seccomp()  # last: it forbids mount/pivot_root, which the setup above needed
        wait_go()
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fds[0], 1)  # the output pump's FIFOs (_output): stream-tagged, rotated logs
        os.dup2(log_fds[1], 2)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if listen_fds:
            # Out of the way of 3, 4, ... first (err_fd must stay open, close-on-exec, until execve).
            err_fd = fcntl.fcntl(err_fd, fcntl.F_DUPFD_CLOEXEC, 64)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in listen_fds]
            for index, fd in enumerate(high):
                os.dup2(fd, EXECD_SOCKET_FD + index, inheritable=True)
        if in_process:
            _become_execd(spec, argv, err_fd, EXECD_SOCKET_FD + len(listen_fds))
        os.execvpe(argv[0], argv, spec["env"])
    except BaseException as exc:  # report any failure to the supervisor, never return into its code
        with contextlib.suppress(BaseException):
            os.write(err_fd, f"{type(exc).__name__}: {exc}".encode()[:4000])
    finally:
        os._exit(127)


#: Mount kinds of :func:`_mount_plan`, and the attributes of each (only ever added to the host mount's).
_RO = lx.MOUNT_ATTR_RDONLY | lx.MOUNT_ATTR_NOSUID | lx.MOUNT_ATTR_NODEV
_ATTRS = {
    "image": lx.MOUNT_ATTR_RDONLY | lx.MOUNT_ATTR_NODEV,  # the image's host dirs (/usr): setuid sudo works
    "ro": _RO,
    "control": _RO | lx.MOUNT_ATTR_NOEXEC,
    "run": lx.MOUNT_ATTR_NOSUID | lx.MOUNT_ATTR_NODEV,
}


def _mount_plan(spec: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(target inside, host source, kind)`` of every mount the supervisor builds detached, in order (the
    root first). The same list on both sides: the init moves the n-th descriptor it receives to the n-th target.
    """
    plan = [("", "", "overlay")]
    plan += [(host_dir, host_dir, "image") for host_dir in spec["image_binds"]]
    if spec.get("run_dir"):
        plan.append(("/run/adx", spec["run_dir"], "run"))
    if spec.get("control_dir"):
        # Read-only: the sandbox can connect to the hub's socket but never replace it (sockets are exempt
        # from EROFS on connect); only sandboxd, on the host, (re)binds it.
        plan.append((CONTROL_DIR_INSIDE, spec["control_dir"], "control"))
    plan += [(inside, host_dir, "ro") for inside, host_dir in spec.get("ro_binds", {}).items()]
    return plan


def _build_mounts(spec: dict[str, Any], pid: int) -> list[int]:
    """The sandbox's mounts as detached mount descriptors, in :func:`_mount_plan` order (here, as host root:
    an idmapped mount and the overlay over it need privilege over the host's filesystems, which the init in
    its user namespace lacks). With a user namespace, first its ID maps (the init waits for the mounts, so
    it never runs unmapped), and the sandbox's own dirs (upper layer, run dir) become its root's.

    Read-only host trees (image layers, image binds, ro_binds, the control dir) are idmapped: host root's files
    are the sandbox root's. The upper layer and run dir are not: their files are stored with the sandbox's host
    IDs, which its namespace maps to its own.
    """
    userns = spec.get("userns")
    uns_fd = None
    fds: list[int] = []
    try:
        if userns is not None:
            base, size = int(userns["base"]), int(userns["size"])
            lx.write_id_maps(pid, base, size)
            uns_fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            for own in (spec["upper_dir"], spec.get("run_dir")):
                if own and os.stat(own).st_uid == 0:  # fresh (a restored layer was shifted by sandboxd)
                    os.chown(own, base, base)
        for _, source, kind in _mount_plan(spec):
            if kind == "overlay":
                fds.append(_build_overlay(spec, uns_fd))
            elif kind == "ro":
                fds.append(_read_only_overlay(spec, source, uns_fd))
            else:
                fds.append(lx.detached_bind(source, _ATTRS[kind], uns_fd if kind != "run" else None))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        if uns_fd is not None:
            os.close(uns_fd)
    return fds


def _build_overlay(spec: dict[str, Any], uns_fd: int | None) -> int:
    """The sandbox's root: an overlay of the image's read-only layers (``image_root``, colon-joined) and its
    own upper layer, detached. Lowers go by descriptor, upper and work dir by names relative to their common
    parent (our cwd meanwhile): /proc/mounts inside shows ``lowerdir+=/,upperdir=upper,workdir=ovlwork``."""
    upper = spec.get("upper_dir") or f"{spec['sandbox_dir']}/upper"
    work = spec.get("work_dir") or f"{spec['sandbox_dir']}/ovlwork"
    parent = os.path.dirname(upper)
    if os.path.dirname(work) != parent:
        raise OSError(f"upper and work dir must share a parent: {upper}, {work}")
    lowers: list[int] = []
    try:
        for layer in spec["image_root"].split(":"):
            lowers.append(lx.detached_bind(layer, lx.MOUNT_ATTR_RDONLY, uns_fd, recursive=False))
        os.chdir(parent)
        # xino=off, index=off: no inode-number composition or index bookkeeping (measurably faster mounts);
        # the layers share one filesystem here, so (st_dev, st_ino) stay unique anyway.
        options = {"xino": "off", "index": "off"}
        return lx.detached_overlay(
            lowers, os.path.basename(upper), os.path.basename(work), options, lx.MOUNT_ATTR_NODEV
        )
    finally:
        os.chdir("/")
        for fd in lowers:
            os.close(fd)


def _read_only_overlay(spec: dict[str, Any], source: str, uns_fd: int | None) -> int:
    """A host dir (``ro_binds``: execd's runtime, an operator's dirs) as a read-only overlay of it and an empty
    dir (the sandbox's rootfs mount point, empty on the host): a filesystem of its own, so the mount table
    inside shows ``/`` where a bind would show the host path of its source. Files only: a Unix socket is not
    reachable through overlayfs (the control dir stays a bind)."""
    lowers: list[int] = []
    try:
        for layer in (source, f"{spec['sandbox_dir']}/rootfs"):
            lowers.append(lx.detached_bind(layer, lx.MOUNT_ATTR_RDONLY, uns_fd, recursive=False))
        return lx.detached_overlay(lowers, None, None, {}, _ATTRS["ro"])
    finally:
        for fd in lowers:
            os.close(fd)


def _send_mounts(sock_fd: int, spec: dict[str, Any], pid: int) -> str | None:
    """Build the mounts and send them to the init (closing ``sock_fd``); the error, if that failed (the init
    then gets none and fails its setup)."""
    error = None
    fds: list[int] = []
    try:
        fds = _build_mounts(spec, pid)
    except OSError as exc:
        error = f"preparing the sandbox's mounts failed: {exc}"
    sock = socket.socket(fileno=sock_fd)
    try:
        socket.send_fds(sock, [b"1" if error is None else b"0"], fds)
    except OSError as exc:
        error = error or f"handing the mounts to the sandbox's init failed: {exc}"
    finally:
        sock.close()
        for fd in fds:
            os.close(fd)
    return error


def _receive_mounts(sock_fd: int) -> list[int]:
    sock = socket.socket(fileno=sock_fd)
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 1, 64)
    finally:
        sock.close()
    if msg != b"1":
        raise OSError("the supervisor could not prepare the sandbox's mounts")
    return fds


@dataclass
class PreparedInit:
    """A sandbox's init cloned by an idle zygote before any spec (:func:`prepare_init`): it waits for one."""

    pid: int
    spec_w: int  # the spec goes here (then closed); EOF without one makes the init exit
    go_w: int
    err_r: int
    mounts_w: int  # its mounts go here (one message, :func:`_send_mounts`)
    userns: bool  # cloned into a user namespace of its own


#: What a prepared init's namespaces suit: none of execd's pre-bound sockets, a network namespace of its own.
_PREPARED_FLAGS = lx.CLONE_NEWPID | lx.CLONE_NEWNS | lx.CLONE_NEWUTS | lx.CLONE_NEWIPC | lx.CLONE_NEWNET


def prepare_init(close: tuple[int, ...], userns: bool = False) -> PreparedInit | None:
    """Clone the next sandbox's init while its zygote is idle (None if that fails: the start clones then).

    The clone (~1 ms: namespaces, a copy of this process), private mount propagation, ``lo`` up and the
    bounding set are the same for every sandbox, so a create no longer waits for them. The init holds no spec
    until it gets its own; it joins its cgroups when they exist (before ``go``: nothing of the workload runs
    outside them; the setup before that is charged to sandboxd's cgroup, as the supervisor's own work is).
    ``close``: the zygote's descriptors the init must not hold.
    """
    spec_r, spec_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    mounts_r, mounts_w = _mounts_pair()
    try:
        pid = lx.clone3(_PREPARED_FLAGS | (lx.CLONE_NEWUSER if userns else 0))
    except OSError as exc:
        print(f"preparing an init failed (the start clones one): {exc}", flush=True)
        for fd in (spec_r, spec_w, go_r, go_w, err_r, err_w, mounts_r, mounts_w):
            os.close(fd)
        return None
    if pid == 0:
        code = 127
        try:
            for fd in (*close, spec_w, go_w, err_r, mounts_w):
                os.close(fd)
            code = _prepared_init_main(spec_r, go_r, err_w, mounts_r)
        finally:
            os._exit(code)
    for fd in (spec_r, go_r, err_w, mounts_r):
        os.close(fd)
    return PreparedInit(pid, spec_w, go_w, err_r, mounts_w, userns)


def _mounts_pair() -> tuple[int, int]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return a.detach(), b.detach()  # close-on-exec, as every socket Python makes


def _prepared_init_main(spec_r: int, go_r: int, err_w: int, mounts_r: int) -> int:
    """A prepared init: the spec-independent setup, then its spec, then :func:`_in_namespace_setup`."""
    try:
        lx.mount(None, "/", None, lx.MS_REC | lx.MS_PRIVATE)
        lx.set_loopback_up()
        lx.drop_bounding_set()
        chunks = []
        while chunk := os.read(spec_r, 1 << 16):
            chunks.append(chunk)
        os.close(spec_r)
        if not chunks:
            return 0  # the zygote is gone without a spec
        spec = json.loads(b"".join(chunks))
        log_fds = open_write_ends(spec["sandbox_dir"], spec["output_pipes"])
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(err_w, f"{type(exc).__name__}: {exc}".encode()[:4000])
        return 127
    _in_namespace_setup(spec, log_fds, err_w, go_r, mounts_r, prepared=True)  # never returns
    return 127


def _hand_to_prepared(init: PreparedInit | None, spec: dict[str, Any]) -> PreparedInit | None:
    """Give ``spec`` to the prepared init when it suits it; None when the start must clone one (and then the
    prepared one, unusable or gone, is ended)."""
    if init is None:
        return None
    if (
        spec["network"] in ("none", "veth")
        and not spec.get("execd_sockets")
        and init.userns == bool(spec.get("userns"))
    ):
        data = json.dumps(spec).encode()
        try:
            while data:
                data = data[os.write(init.spec_w, data) :]
            os.close(init.spec_w)
            return init
        except OSError:  # it died (killed?)
            pass
    with contextlib.suppress(OSError):
        os.close(init.spec_w)  # EOF without a spec: it exits
    with contextlib.suppress(ProcessLookupError):
        os.kill(init.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(init.pid, 0)
    os.close(init.go_w)
    os.close(init.err_r)
    os.close(init.mounts_w)
    return None


def _become_execd(spec: dict[str, Any], argv: list[str], err_fd: int, first_free: int) -> NoReturn:
    """PID 1 runs execd right here instead of exec'ing ``python3 -m adx.execd`` (the execd zygote).

    Only for a supervisor forked from the spawner's pristine template (``_spawner``), which runs the very
    interpreter the sandbox would exec (the host's, bound read-only at the same path) and imported execd before
    it read any request: no other sandbox's spec was ever in this memory. What execve would have done is done
    here: argv and environment (``set_process_args``, for /proc), Python's own after-fork bookkeeping (clone3
    bypassed ``os.fork``), close-on-exec descriptors, signal dispositions, and the import path as seen inside
    (execd's runtime at ``/opt/adx``, the interpreter's library under the image's host binds).
    """
    from adx.execd import _main as execd  # already imported by the template: nothing is read from disk

    os.closerange(first_free, err_fd)
    os.closerange(err_fd + 1, 65536)
    os.close(err_fd)  # where execve would close it: the supervisor reports the start
    code = 1
    try:  # from here on nothing may reach _in_namespace_setup's handler (its err_fd is gone)
        ctypes.pythonapi.PyOS_AfterFork_Child()
        os.environ.clear()
        os.environ.update(spec["env"])
        binds = tuple(spec["image_binds"])
        inside = [p for p in sys.path if any(p == b or p.startswith(b + "/") for b in binds)]
        sys.path[:] = [spec["env"]["PYTHONPATH"], *inside]
        sys.path_importer_cache.clear()
        sys.argv = [f"{spec['env']['PYTHONPATH']}/adx/execd/__main__.py", *argv[3:]]
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        code = execd.main(argv[3:])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# Without a user namespace the sandbox's root is uid 0, and many /proc/sys files check only the uid: a write to
# kernel/core_pattern would run a host command as root. These stay read-only; kernel-internals are masked
# (with a user namespace too: defence in depth, the same table either way).
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
_PROC_MASKED = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats", "kallsyms", "kmsg")


# A fresh proc has the same top-level entries as the host's: look them up once (in the spawner), not per child.
_PROC_READ_ONLY_HERE = tuple(n for n in _PROC_READ_ONLY if os.path.exists(f"/proc/{n}"))
_PROC_MASKED_HERE = tuple(n for n in _PROC_MASKED if os.path.exists(f"/proc/{n}"))


def _harden_proc(proc: str) -> None:
    for name in _PROC_READ_ONLY_HERE:
        path = f"{proc}/{name}"
        lx.mount(path, path, None, lx.MS_BIND | lx.MS_REC)
        lx.mount(None, path, None, lx.MS_REMOUNT | lx.MS_BIND | lx.MS_RDONLY | lx.MS_NOSUID | lx.MS_NODEV)
    for name in _PROC_MASKED_HERE:
        lx.mount("/dev/null", f"{proc}/{name}", None, lx.MS_BIND)


def _record_state(sdir: str) -> str | None:
    try:
        with open(os.path.join(sdir, RECORD_FILE)) as f:
            rec = json.loads(f.read())
    except (FileNotFoundError, ValueError):
        return None
    state = rec.get("record", {}).get("state")
    return state if isinstance(state, str) else None


def run_supervisor(spec: dict[str, Any], layout: CgroupLayout, result_fd: int, init: PreparedInit | None = None) -> int:
    """Supervise one sandbox. Reports ``{"ok": ...}`` once on ``result_fd``; returns the process exit code.

    ``init``: the sandbox's init prepared by this zygote (used when the spec suits it; ended otherwise).

    sandboxd asks for the start before its record commit is done (an fsync, ~1-2 ms) and holds the lifecycle
    lock until the record is in place. Everything that runs no workload code — the cgroup, the init's
    namespaces and mounts — is prepared meanwhile; the init execs only after the committed ``creating``
    record was seen under the lock and the identity persisted (the ``go`` byte). A refused start kills that
    init and removes the cgroup made here: nothing of it outlives the supervisor.
    """
    sdir: str = spec["sandbox_dir"]  # paths as str: the template (every in-process execd PID 1) has no pathlib

    def report(payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(result_fd, data) :]
        with contextlib.suppress(OSError):
            os.close(result_fd)

    # The output pump reads the FIFOs the init's stdout/stderr open: it exists before any init has the spec.
    pump = start_pump(spec)
    spec["output_pipes"] = pump is not None
    # First: the prepared init mounts the sandbox's root while the rest is done here.
    prepared = _hand_to_prepared(init, spec)
    mount_error = _send_mounts(prepared.mounts_w, spec, prepared.pid) if prepared is not None else None
    res = spec["resources"]
    cgroup = SandboxCgroup(layout, spec["cgroup_parent"], spec["sandbox_id"])
    try:
        cgroup.ensure_parent()
    except OSError as exc:
        report({"ok": False, "error": f"cgroup setup failed: {exc}"})
        return 1
    if spec["network"] != "veth" and prepared is None:  # with veth the supervisor runs `ip` (CAP_NET_ADMIN)
        try:
            # The sandbox's init inherits it (what it would otherwise do first thing, ~40 prctl calls); this
            # process keeps its effective capabilities and execs nothing.
            lx.drop_bounding_set()
        except OSError as exc:
            report({"ok": False, "error": f"capability bounding set: {exc}"})
            return 1
    lock_fd = os.open(os.path.join(sdir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    # Hybrid host: the cgroup2 dir (the identity; the init is cloned or moved into it) now; the v1 limit dirs
    # while the init mounts.
    defer_v1 = cgroup.v2_dir is not None and bool(cgroup.v1_dirs)
    try:
        # mkdir fails when the leaf exists: an ID's cgroup is only ever made here, once.
        cgroup.create(res["cpu_millis"], res["memory_bytes"], res["pids_max"], defer_v1=defer_v1, parent=False)
        ident = cgroup.identity()
        assert ident is not None
    except Exception as exc:
        report({"ok": False, "error": f"cgroup setup failed: {exc}"})
        return 1

    if prepared is not None:
        pid, go_w, err_r = prepared.pid, prepared.go_w, prepared.err_r
        # Moving a task into a cgroup can wait for an RCU grace period (milliseconds; one for the whole
        # burst); doing it here overlaps that wait with the init's mounts (and the record commit).
        ok = _join(cgroup, res, pid, create_v1=defer_v1, v2=True)
    else:
        # The dir is the sandbox's (sandboxd made it before asking): files made in it before the commit are
        # reclaimed with it if the commit never happens.
        pid, go_w, err_r, mounts_w = _clone_init(spec, cgroup, open_write_ends(sdir, pump is not None))
        if pid < 0:
            report({"ok": False, "error": f"starting the sandbox's init failed: {os.strerror(-pid)}"})
            return 1
        mount_error = _send_mounts(mounts_w, spec, pid)
        ok = _join(cgroup, res, pid, create_v1=defer_v1, v2=False)
    if mount_error is not None:
        _abandon(pid, go_w, cgroup)
        os.close(err_r)
        report({"ok": False, "error": mount_error})
        return 1

    # Blocking: sandboxd holds it while it commits the record, a concurrent delete only for moments; the
    # intent check below decides.
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    refusal = None
    if os.path.exists(os.path.join(sdir, TOMBSTONE_FILE)) or _record_state(sdir) != "creating":
        refusal = "delete intent persisted or record not creating; not starting"
    elif os.path.exists(os.path.join(sdir, NATIVE_FILE)):
        refusal = "sandbox was started before; IDs are never restarted"
    if refusal is not None:
        _abandon(pid, go_w, cgroup)
        report({"ok": False, "error": refusal})
        return 0
    native = {
        "boot_id": _BOOT_ID,
        "cgroup_dev": ident[0],
        "cgroup_ino": ident[1],
        "cgroup_dir": cgroup.identity_path(),
        "created_at": time.time(),
    }
    try:
        # No fsync here (hot path): this file only has meaning within the boot that wrote it — a reboot kills
        # every sandbox and is detected through boot_id — and rename keeps it whole across process crashes.
        _write_json_no_sync(os.path.join(sdir, NATIVE_FILE), native)
    except Exception as exc:
        _abandon(pid, go_w, None)  # the committed record's cleanup (sandboxd) removes the cgroup
        report({"ok": False, "error": f"cgroup setup failed: {exc}"})
        return 1
    if ok and spec["network"] == "veth":
        ok = _create_veth(spec["veth"], pid)
    with contextlib.suppress(BrokenPipeError):  # the child failed already: its error follows on err_r
        os.write(go_w, b"1" if ok else b"0")
    os.close(go_w)
    chunks = []
    while chunk := os.read(err_r, 4096):  # EOF when execve closed the CLOEXEC write end
        chunks.append(chunk)
    os.close(err_r)
    if chunks:
        os.waitpid(pid, 0)
        report({"ok": False, "error": "sandbox setup failed: " + b"".join(chunks).decode(errors="replace")})
        _record_exit(sdir, None, None, cgroup, setup_failed=True)
        return 1
    report({"ok": True, "native": native, "started_at": time.time()})
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            status = -1
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
    code = os.waitstatus_to_exitcode(status) if status != -1 else None
    finish_pump(pump)  # the output is complete when the exit is recorded
    if code is None:
        _record_exit(sdir, None, None, cgroup, lock_fd=lock_fd)
    elif code < 0:
        _record_exit(sdir, None, -code, cgroup, lock_fd=lock_fd)
    else:
        _record_exit(sdir, code, None, cgroup, lock_fd=lock_fd)
    return 0


def _abandon(pid: int, go_w: int, cgroup: SandboxCgroup | None) -> None:
    """Undo a prepared start that must not happen: the init (which never got ``go``, so ran nothing of the
    workload) is killed and reaped, then the cgroup made for it removed (when ``cgroup`` is given)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.close(go_w)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    if cgroup is not None:
        try:
            cgroup.remove()
        except OSError as exc:
            print(f"removing the cgroup of a refused start failed: {exc}", flush=True)


def _clone_init(spec: dict[str, Any], cgroup: SandboxCgroup, log_fds: tuple[int, int]) -> tuple[int, int, int, int]:
    """Clone the sandbox's init now (into its cgroup2 dir): ``(pid, go_w, err_r, mounts_w)``; ``pid`` is
    ``-errno`` when that failed. Closes ``log_fds`` (the init's stdout and stderr)."""
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    mounts_r, mounts_w = _mounts_pair()
    flags = lx.CLONE_NEWPID | lx.CLONE_NEWNS | lx.CLONE_NEWUTS | lx.CLONE_NEWIPC
    if spec.get("userns"):
        flags |= lx.CLONE_NEWUSER  # here, before the init's seccomp filter (which refuses it) exists
    if spec["network"] in ("none", "veth"):
        flags |= lx.CLONE_NEWNET
    listen_fds: tuple[int, ...] = ()
    cg_fd = None
    try:
        if spec.get("execd_sockets"):
            listen_fds = tuple(lx.listen_unix(f"{spec['execd_sockets']}/{name}") for name in EXECD_SOCKET_NAMES)
        cg_fd = os.open(cgroup.v2_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if cgroup.v2_dir else None
        pid = lx.clone3(flags, cg_fd)
    except OSError as exc:
        cg = [cg_fd] if cg_fd is not None else []
        for fd in (go_r, go_w, err_r, err_w, *log_fds, mounts_r, mounts_w, *listen_fds, *cg):
            os.close(fd)
        return -(exc.errno or 1), -1, -1, -1
    if pid == 0:
        os.close(err_r)
        os.close(go_w)
        os.close(mounts_w)
        _in_namespace_setup(spec, log_fds, err_w, go_r, mounts_r, listen_fds)  # never returns
    for fd in listen_fds:
        os.close(fd)  # PID 1 owns the listeners now: they live exactly as long as the sandbox's init
    for fd in (err_w, go_r, *log_fds, mounts_r, *([cg_fd] if cg_fd is not None else [])):
        os.close(fd)
    return pid, go_w, err_r, mounts_w


def _join(cgroup: SandboxCgroup, res: dict[str, int], pid: int, *, create_v1: bool, v2: bool) -> bool:
    """Move ``pid`` into the cgroup2 dir (``v2``: it was not cloned into it) and the v1 limit hierarchies
    (made here when ``create_v1``)."""
    try:
        if v2 and cgroup.v2_dir is not None:
            fd = os.open(f"{cgroup.v2_dir}/cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, str(pid).encode())
            finally:
                os.close(fd)
        if create_v1:
            cgroup.create_v1(res["cpu_millis"], res["memory_bytes"], res["pids_max"])
        for path in cgroup.v1_procs_files():
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, str(pid).encode())
            finally:
                os.close(fd)
    except OSError as exc:
        print(f"joining the sandbox's cgroups failed: {exc}", flush=True)
        return False
    return True


def _create_veth(veth: dict[str, Any], pid: int) -> bool:
    """Host end in the host namespace, peer ``eth0`` straight into the sandbox's (one ``ip -batch``)."""
    batch = (
        f"link add {veth['host_if']} type veth peer name eth0 netns {pid}\n"
        f"addr add {veth['host_ip']}/{veth['prefix']} dev {veth['host_if']}\n"
        f"link set {veth['host_if']} up\n"
    )
    out = subprocess.run(["ip", "-batch", "-"], input=batch.encode(), capture_output=True, check=False)
    if out.returncode != 0:
        print(f"veth setup failed: {out.stderr.decode(errors='replace')}", flush=True)
        return False
    return True


def _write_json_no_sync(path: str, value: dict[str, Any]) -> None:
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.tmp")  # NATIVE_TEMP: pre-made by a spare dir, usually
    with open(tmp, "w") as f:
        f.write(json.dumps(value))
    os.replace(tmp, path)


def _record_exit(
    sdir: str,
    code: int | None,
    sig: int | None,
    cgroup: SandboxCgroup,
    *,
    setup_failed: bool = False,
    lock_fd: int | None = None,
) -> None:
    """Publish how the workload ended, release the lifecycle lock, then make the record durable.

    Publication is an atomic rename (enough for sandboxd restarts: the page cache survives them). The lock is
    released right after, so a waiting Delete is not held up by the disk; the fsyncs that make the record
    survive a host crash too follow (harmless if a Delete already reclaimed the file).
    """
    try:
        oom_kills = cgroup.oom_kills()
    except OSError:
        oom_kills = 0
    record = {
        "exit_code": code,
        "signal": sig,
        # The kernel killed something in this sandbox for memory and the init died of SIGKILL.
        "oom_killed": bool(oom_kills) and sig == signal.SIGKILL,
        "oom_kills": oom_kills,
        "setup_failed": setup_failed,
        "finished_at": time.time(),
        "boot_id": boot_id(),
    }
    path = os.path.join(sdir, EXIT_FILE)
    tmp = os.path.join(sdir, f".{EXIT_FILE}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(record, indent=2, sort_keys=True).encode() + b"\n")
        os.replace(tmp, path)
        if lock_fd is not None:
            os.close(lock_fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        fsync_dir(sdir)
