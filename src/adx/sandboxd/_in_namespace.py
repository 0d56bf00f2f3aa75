"""What the sandbox's init does in its new namespaces before it becomes the workload (or execd).

It runs in the cloned child, PID 1 of the new PID namespace, and ends in ``execve`` or ``_exit``: mounts
(received from the supervisor), ``/proc`` and ``/dev``, the network device, pivot_root, capabilities and seccomp,
then the wait for the supervisor's ``go``. A warm member's init waits for its claim before pivot_root (its host
name, cwd, environment and argv are the claim's) — except one whose execd runs on the image's interpreter
(``SpawnSpec.prestarts_execd``): it execs that interpreter right away, confined, into ``adx.execd._prestart``,
which waits for the claim with execd imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import stat
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import NoReturn

from adx.execd._process_args import ROOM_VARIABLE, set_process_args
from adx.sandboxd import _confinement as confine
from adx.sandboxd import _linux as lx
from adx.sandboxd import _mount_api as mapi
from adx.sandboxd import _netif as netif
from adx.sandboxd._mounts import mount_plan, receive_mounts
from adx.sandboxd._sandbox_layout import EXECD_SOCKET_FD
from adx.sandboxd._spawn_spec import SpawnSpec, read_to_eof

__all__ = ["in_namespace_setup"]

_DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


def in_namespace_setup(
    spec: SpawnSpec,
    log_fds: tuple[int, int],
    err_fd: int,
    go_fd: int,
    mounts_fd: int,
    listen_fds: tuple[int, ...] = (),
    prepared: bool = False,
) -> None:
    """Runs in the cloned child (PID 1 of the new PID namespace); ends in execve or _exit.

    ``prepared``: this child was cloned before its spec existed (``_prepared_init.prepare_init``), which made its mounts
    private and brought ``lo`` up already.

    ``mounts_fd``: the supervisor sends the sandbox's root and host binds here, built as detached mounts
    (``_mounts._build_mounts``: idmapped for a user namespace, whose ID maps it wrote first; no host path in their
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
            if not spec.warm:
                os.close(go_fd)

    try:
        sdir = spec.sandbox_dir
        root = f"{sdir}/rootfs"
        userns = spec.userns is not None
        if not prepared:
            # Nothing we mount may propagate back to the host's mount namespace.
            lx.mount(None, "/", None, lx.MS_REC | lx.MS_PRIVATE)
        fds = receive_mounts(mounts_fd)
        # The root first, while we are still host uid 0 (the sandbox dir's path is host root's, mode 0700);
        # then everything relative to it, from inside it.
        mapi.move_mount(fds[0], root)
        os.close(fds[0])
        os.chdir(root)
        root = "."
        if userns:
            # The maps are written (before the mounts were sent): from here on we are the namespace's root, a
            # host ID of the sandbox's range, with capabilities only over what that namespace owns.
            os.setresgid(0, 0, 0)
            os.setgroups([])
            os.setresuid(0, 0, 0)
            confine.set_dumpable()
        for (target, _, _), fd in zip(mount_plan(spec)[1:], fds[1:], strict=True):
            path = f"{root}{target}"
            os.makedirs(path, exist_ok=True)  # a missing mount point lands in the upper layer (an empty dir)
            mapi.move_mount(fd, path)
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
        if spec.network in ("none", "veth") and not prepared:
            netif.set_loopback_up()
        if spec.veth is not None:  # network 'veth'
            wait_go()  # the supervisor moves our end of the veth pair into this namespace first
            veth = spec.veth
            netif.configure_interface("eth0", veth.sandbox_ip, veth.prefix)
            netif.add_default_route(veth.host_ip)  # egress goes through the node (nftables policy + NAT)
        prestart = spec.prestarts_execd
        if prestart:
            wait_go()  # placed; the claim comes after the exec, to adx.execd._prestart
            go_fd = fcntl.fcntl(go_fd, fcntl.F_DUPFD_CLOEXEC, 64)  # out of the way of the sockets' 3, 4, ...
        elif spec.warm:
            spec = _await_claim(spec, wait_go, go_fd, err_fd)
        lx.sethostname(spec.hostname)
        # pivot_root(".", ".") stacks the old root under the new one; detaching it leaves no path back.
        lx.pivot_root(".", ".")
        lx.umount2(".", lx.MNT_DETACH)
        os.chdir("/")
        os.chdir(spec.cwd)
        argv = spec.init_argv
        in_process = spec.execd_in_process
        if in_process:
            set_process_args(argv, spec.env)
        if spec.allow_setuid:
            # Store images (E2B-like: ``sudo``): no no_new_privs, so setuid programs work; what they gain is
            # bounded by the same trimmed capability set. Seccomp goes first: without no_new_privs installing
            # it needs CAP_SYS_ADMIN, which the drop removes (the filter allows prctl and capset).
            confine.install_seccomp()
            confine.drop_capabilities(no_new_privs=False)
        else:
            confine.drop_capabilities()
            confine.install_seccomp()  # last: it forbids mount/pivot_root, which the setup above needed
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
        if prestart:
            _exec_prestart(spec, go_fd, err_fd, EXECD_SOCKET_FD + len(listen_fds))
        os.execvpe(argv[0], argv, spec.env)
    except BaseException as exc:  # report any failure to the supervisor, never return into its code
        with contextlib.suppress(BaseException):
            os.write(err_fd, f"{type(exc).__name__}: {exc}".encode()[:4000])
    finally:
        os._exit(127)


def _await_claim(spec: SpawnSpec, wait_go: Callable[[], None], go_fd: int, err_fd: int) -> SpawnSpec:
    """A warm pool member's init, placed and mounted: park until a create claims it. The supervisor then sends
    (after ``go``) what is the claiming sandbox's own: hostname, cwd, environment and argv; EOF without them
    (the member was dropped) ends this init before anything of a workload existed. A NUL byte on ``err_fd``
    tells the supervisor that this init got this far (its member is only reported ready then)."""
    wait_go()
    os.write(err_fd, b"\0")
    data = read_to_eof(go_fd)
    if not data:
        os._exit(0)
    claim = json.loads(data)
    return replace(spec, hostname=claim["hostname"], cwd=claim["cwd"], env=claim["env"], init_argv=claim["init_argv"])


#: The pre-started execd's entry (not imported here: the spawner stays without execd unless its template has it).
_PRESTART_MODULE = "adx.execd._prestart"
#: Room kept in the pre-started execd's argv and environment areas for the claim's (``/proc`` shows them).
_PRESTART_ROOM = 8192


def _exec_prestart(spec: SpawnSpec, go_fd: int, err_fd: int, first_free: int) -> None:
    """A warm member of a shape whose execd runs on the image's interpreter: exec that interpreter now, as a cold
    start would (same place, same descriptors and confinement), into ``adx.execd._prestart``, which imports execd
    and waits on ``go_fd`` for the claim. ``go_fd`` and ``err_fd`` become the next free descriptors after the
    listening sockets (inheritable); the originals close at exec. Returns only when the exec failed (raises)."""
    for index, fd in enumerate([fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in (go_fd, err_fd)]):
        os.dup2(fd, first_free + index, inheritable=True)
    argv = [spec.init_argv[0], "-m", _PRESTART_MODULE, str(first_free), str(first_free + 1), "-" * _PRESTART_ROOM]
    env = {**spec.env, ROOM_VARIABLE: "-" * _PRESTART_ROOM}
    os.execvpe(argv[0], argv, env)


def _become_execd(spec: SpawnSpec, argv: list[str], err_fd: int, first_free: int) -> NoReturn:
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
    try:  # from here on nothing may reach in_namespace_setup's handler (its err_fd is gone)
        ctypes.pythonapi.PyOS_AfterFork_Child()
        os.environ.clear()
        os.environ.update(spec.env)
        binds = tuple(spec.image_binds)
        inside = [p for p in sys.path if any(p == b or p.startswith(b + "/") for b in binds)]
        sys.path[:] = [spec.env["PYTHONPATH"], *inside]
        sys.path_importer_cache.clear()
        sys.argv = [f"{spec.env['PYTHONPATH']}/adx/execd/__main__.py", *argv[3:]]
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
