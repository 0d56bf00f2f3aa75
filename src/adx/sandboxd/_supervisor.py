"""The per-sandbox supervisor and the in-namespace setup of the workload.

A supervisor is forked (twice, so it is re-parented away from the spawner) by the single-threaded spawner.
It outlives sandboxd restarts and from the record's commit on holds the sandbox's exclusive lifecycle lock
(``lifecycle.lock``). Before that it prepares what runs no workload code: the cgroup, and the init in its
namespaces (cloned by the idle zygote, ``prepare_init``, or now) and cgroups, mounting its root and then
waiting. Under the lock it refuses to start when a
delete intent is persisted (SBX-7), the record is not a committed ``creating`` one, or the sandbox was started
before (IDs are never restarted, SBX-5) — killing that init and removing the cgroup — and otherwise persists
the native identity (boot ID + cgroup inode) *before* letting the init exec the workload, then waits for it
(pumping its output meanwhile: ``_output``; no process of its own, issue 16) and durably records how it ended
(exit code / signal / OOM) in ``exit.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from adx._fs import fsync_dir
from adx.sandboxd import _confinement as confine
from adx.sandboxd import _linux as lx
from adx.sandboxd import _unix_sockets as usock
from adx.sandboxd._cgroups import CgroupLayout, CpuPhase, SandboxCgroup
from adx.sandboxd._in_namespace import in_namespace_setup
from adx.sandboxd._mounts import mounts_pair, send_mounts
from adx.sandboxd._output import Pump, make_fifos, open_write_ends
from adx.sandboxd._prepared_init import PreparedInit, hand_to_prepared
from adx.sandboxd._rtnetlink import create_veth
from adx.sandboxd._sandbox_layout import (
    CLAIM_SOCKET,
    EXECD_SOCKET_NAMES,
    EXIT_FILE,
    LOCK_FILE,
    NATIVE_FILE,
    RECORD_FILE,
    TOMBSTONE_FILE,
    boot_id,
)
from adx.sandboxd._spawn_spec import Limits, NativeFile, SpawnReport, SpawnSpec, Veth, read_to_eof

__all__ = ["run_supervisor"]

#: Read once, in the spawner before it forks (a boot's ID never changes): not a file read per create.
_BOOT_ID = boot_id()


def _record_state(sdir: str) -> str | None:
    try:
        with open(os.path.join(sdir, RECORD_FILE)) as f:
            rec = json.loads(f.read())
    except (FileNotFoundError, ValueError):
        return None
    state = rec.get("record", {}).get("state")
    return state if isinstance(state, str) else None


def run_supervisor(spec: SpawnSpec, layout: CgroupLayout, result_fd: int, init: PreparedInit | None = None) -> int:
    """Supervise one sandbox. Reports ``{"ok": ...}`` once on ``result_fd``; returns the process exit code.

    ``init``: the sandbox's init prepared by this zygote (used when the spec suits it; ended otherwise).

    sandboxd asks for the start before its record commit is done (an fsync, ~1-2 ms) and holds the lifecycle
    lock until the record is in place. Everything that runs no workload code — the cgroup, the init's
    namespaces and mounts, its veth pair — is prepared meanwhile; the init execs only after the committed ``creating``
    record was seen under the lock and the identity persisted (the ``go`` byte). A refused start kills that
    init and removes the cgroup made here: nothing of it outlives the supervisor.
    """
    sdir: str = spec.sandbox_dir  # paths as str: the template (every in-process execd PID 1) has no pathlib
    t0 = time.perf_counter()
    phases: dict[str, float] = {}  # ms since the spec arrived, at each step's end (the start report's "phases")

    def mark(name: str) -> None:
        phases[name] = round((time.perf_counter() - t0) * 1000, 2)

    def report(payload: SpawnReport) -> None:
        """Once per result descriptor (a warm member's ready report, then its claim's start report)."""
        nonlocal result_fd
        if result_fd < 0:
            return
        data = json.dumps(payload).encode()
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(result_fd, data) :]
        with contextlib.suppress(OSError):
            os.close(result_fd)
        result_fd = -1

    # The FIFOs the init's stdout/stderr open exist, their read ends held here, before any init has the spec;
    # this process pumps them once the sandbox started (``_output``). What the init writes before waits in them.
    fifo_reads = make_fifos(sdir)
    spec = replace(spec, output_pipes=fifo_reads is not None)
    mark("pump")
    prepared = hand_to_prepared(init, spec)
    mount_error = None
    res = spec.resources
    cgroup = SandboxCgroup(layout, spec.cgroup_parent, spec.sandbox_id)
    try:
        cgroup.ensure_parent()
    except OSError as exc:
        report({"ok": False, "error": f"cgroup setup failed: {exc}"})
        return 1
    if prepared is None:
        try:
            # The sandbox's init inherits it (what it would otherwise do first thing, ~40 prctl calls); this
            # process keeps its effective capabilities and execs nothing.
            confine.drop_bounding_set()
        except OSError as exc:
            report({"ok": False, "error": f"capability bounding set: {exc}"})
            return 1
    lock_fd = os.open(os.path.join(sdir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    # Hybrid host: the cgroup2 dir (the identity; the init is cloned or moved into it) now; the v1 limit dirs
    # while the init mounts.
    defer_v1 = cgroup.v2_dir is not None and bool(cgroup.v1_dirs)
    cpu = CpuPhase.PARKED if spec.warm else _start_phase(spec)
    try:
        # mkdir fails when the leaf exists: an ID's cgroup is only ever made here, once.
        cgroup.create(res.cpu_millis, res.memory_bytes, res.pids_max, defer_v1=defer_v1, parent=False, cpu=cpu)
        ident = cgroup.identity()
        assert ident is not None
        mark("cgroup")
    except Exception as exc:
        report({"ok": False, "error": f"cgroup setup failed: {exc}"})
        return 1

    veth_ok = True

    def mounts_and_veth(mounts_w: int, pid: int) -> str | None:
        """The init's mounts, then (a cold start's) veth pair: both while the cgroup join waits in the kernel.
        The veth exists before the commit is seen: a refused start kills the init, and the pair goes with its
        network namespace; the egress chain was in place before the spawn was asked for."""
        nonlocal veth_ok
        error = send_mounts(mounts_w, spec, pid)
        if error is None and spec.veth is not None and not spec.warm:  # a warm member's: made when it parks
            veth_ok = _create_veth(spec.veth, pid)
        return error

    if prepared is not None:
        pid, go_w, err_r = prepared.pid, prepared.go_w, prepared.err_r
        ok, mount_error = _join_while(
            cgroup, res, cpu, pid, defer_v1, True, lambda: mounts_and_veth(prepared.mounts_w, prepared.pid)
        )
    else:
        # The dir is the sandbox's (sandboxd made it before asking): files made in it before the commit are
        # reclaimed with it if the commit never happens.
        log_fds = open_write_ends(sdir, spec.output_pipes)
        # A warm member's init waits for its claim before it execs: it must not hold the report pipe open (the
        # spawner forwards the ready report at EOF).
        pid, go_w, err_r, mounts_w = _clone_init(spec, cgroup, log_fds, (result_fd,) if spec.warm else ())
        if pid < 0:
            report({"ok": False, "error": f"starting the sandbox's init failed: {os.strerror(-pid)}"})
            return 1
        ok, mount_error = _join_while(cgroup, res, cpu, pid, defer_v1, False, lambda: mounts_and_veth(mounts_w, pid))
    mark("prepared")  # cgroups joined, mounts built and sent (the init moves them into place meanwhile), veth made
    if mount_error is not None:
        _abandon(pid, go_w, cgroup)
        report({"ok": False, "error": mount_error + _reported(err_r)})
        return 1

    go_payload = b"1" if ok and veth_ok else b"0"
    claimed = spec.warm  # the claim's spec, which replaces this one, is no warm member's
    prestarted = spec.prestarts_execd  # its PID 1 is execd's interpreter already, capabilities dropped
    if claimed:
        ready: SpawnReport = {"ok": True, "warm": True, "pids": [os.getpid(), pid]}
        parked = _park(spec, pid, go_w, err_r, ok, lock_fd, lambda: report(ready))
        if isinstance(parked, str):  # not claimed (dropped, or never ready)
            _abandon(pid, go_w, cgroup)
            parked += _reported(err_r)
            report({"ok": False, "error": parked})  # a no-op after the ready report
            return 0
        conn, spec = parked
        result_fd = conn.detach()  # the claiming create reads this start's report here
        sdir = spec.sandbox_dir  # renamed by the claim; the cgroup keeps its name (cgroup v2 refuses renames)
        claim = {"hostname": spec.hostname, "cwd": spec.cwd, "env": spec.env, "init_argv": spec.init_argv}
        go_payload = json.dumps(claim).encode()
        try:
            # Out of idle priority before anything of the claim runs: its start-up as a cold start's (boosted
            # for execd, else its quota). The claim's resources are the member's (``WarmKey``).
            cgroup.set_cpu(_start_phase(spec), spec.resources.cpu_millis)
        except OSError as exc:
            _abandon(pid, go_w, cgroup)
            report({"ok": False, "error": f"cgroup setup failed: setting the claim's CPU: {exc}"})
            return 1
    # Blocking: sandboxd holds it while it commits the record, a concurrent delete only for moments; the
    # intent check below decides.
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    if claimed:
        t0, phases = time.perf_counter(), {}  # a claim: from the lock on (the member's setup was long before)
    mark("locked")  # the record commit released it
    refusal = None
    if os.path.exists(os.path.join(sdir, TOMBSTONE_FILE)) or _record_state(sdir) != "creating":
        refusal = "delete intent persisted or record not creating; not starting"
    elif os.path.exists(os.path.join(sdir, NATIVE_FILE)):
        refusal = "sandbox was started before; IDs are never restarted"
    if refusal is not None:
        _abandon(pid, go_w, cgroup)
        report({"ok": False, "error": refusal})
        return 0
    native: NativeFile = {
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
    mark("identity")
    if prestarted:
        try:
            lx.sethostname_of(pid, spec.hostname)  # what its init did itself before the exec, on a cold start
        except OSError as exc:
            _abandon(pid, go_w, None)
            os.close(err_r)
            report({"ok": False, "error": f"sandbox setup failed: setting the host name: {exc}"})
            _record_exit(sdir, None, None, cgroup, setup_failed=True)
            return 1
    boosted_at = time.monotonic()  # the boost's bound counts from the go: nothing of the sandbox's ran before
    with contextlib.suppress(BrokenPipeError):  # the child failed already: its error follows on err_r
        _write_all(go_w, go_payload)
    os.close(go_w)
    mark("go")
    said = read_to_eof(err_r)  # EOF when execve closed the CLOEXEC write end
    mark("exec")  # the init finished its setup (mounts, IDs, confinement) and exec'd
    if said:
        os.waitpid(pid, 0)
        report({"ok": False, "error": "sandbox setup failed: " + said.decode(errors="replace")})
        _record_exit(sdir, None, None, cgroup, setup_failed=True)
        return 1
    report({"ok": True, "native": native, "started_at": time.time(), "phases": phases})
    boost_end = boosted_at + spec.cpu_boost_seconds if _start_phase(spec) is CpuPhase.STARTING else None
    _await_init(spec, pid, fifo_reads, cgroup, boost_end)
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
    if code is None:
        _record_exit(sdir, None, None, cgroup, lock_fd=lock_fd)
    elif code < 0:
        _record_exit(sdir, None, -code, cgroup, lock_fd=lock_fd)
    else:
        _record_exit(sdir, code, None, cgroup, lock_fd=lock_fd)
    return 0


def _park(
    spec: SpawnSpec, pid: int, go_w: int, err_r: int, ok: bool, lock_fd: int, ready: Callable[[], None]
) -> tuple[socket.socket, SpawnSpec] | str:
    """A warm pool member, its init mounted and placed: finish what a claim would otherwise wait for (the veth),
    tell sandboxd it is ready, then park on the lifecycle lock, which sandboxd holds until a claim commits the
    claiming sandbox's record or sandboxd is gone. Returns the claim's connection and spec, or why none came.

    The claim is on ``CLAIM_SOCKET``: sandboxd connects and sends the spec *before* it releases the lock, so an
    accept that finds nothing under the lock means the member was dropped (a sandboxd restart removes members).
    """
    sdir = spec.sandbox_dir
    if ok and spec.veth is not None:
        ok = _create_veth(spec.veth, pid)
    if not ok:
        return "the warm member's cgroups or network could not be set up"
    try:
        listener = socket.socket(fileno=usock.listen_unix(f"{sdir}/{CLAIM_SOCKET}", backlog=1))
        os.write(go_w, b"1")  # placed: the init configures eth0 and waits for its claim
    except OSError as exc:
        return f"warm member setup failed: {exc}"
    # Ready only once the init has its mounts, its network and waits for a claim (its NUL byte): a member whose
    # init died setting up is never handed to a create.
    if not select.select([err_r], [], [], 30.0)[0]:
        return "the warm member's init did not get ready within 30 s"
    said = os.read(err_r, 1)
    if said != b"\0":
        while chunk := os.read(err_r, 4096):  # it failed and exits: EOF follows its message
            said += chunk
        return "the warm member's init failed: " + said.decode(errors="replace")
    ready()  # to the spawner, whose request is done; a claim's start report goes to the claim's socket
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    listener.setblocking(False)
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return "dropped from the warm pool"
    finally:
        listener.close()
    try:
        conn.setblocking(True)
        conn.settimeout(10.0)
        chunks = []
        while chunk := conn.recv(1 << 16):
            chunks.append(chunk)
        claimed = SpawnSpec.from_json(b"".join(chunks))
        conn.settimeout(None)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        conn.close()
        return f"garbled claim: {exc}"
    return conn, claimed


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _reported(err_r: int) -> str:
    """What an abandoned (killed, reaped) init reported before it died, if anything; closes ``err_r``."""
    chunks = []
    with contextlib.suppress(OSError):
        while chunk := os.read(err_r, 4096):
            chunks.append(chunk)
    os.close(err_r)
    return "; the init reported: " + b"".join(chunks).decode(errors="replace") if chunks else ""


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


def _clone_init(
    spec: SpawnSpec, cgroup: SandboxCgroup, log_fds: tuple[int, int], close: tuple[int, ...] = ()
) -> tuple[int, int, int, int]:
    """Clone the sandbox's init now (into its cgroup2 dir): ``(pid, go_w, err_r, mounts_w)``; ``pid`` is
    ``-errno`` when that failed. Closes ``log_fds`` (the init's stdout and stderr)."""
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    mounts_r, mounts_w = mounts_pair()
    flags = lx.CLONE_NEWPID | lx.CLONE_NEWNS | lx.CLONE_NEWUTS | lx.CLONE_NEWIPC
    if spec.userns:
        flags |= lx.CLONE_NEWUSER  # here, before the init's seccomp filter (which refuses it) exists
    if spec.network in ("none", "veth"):
        flags |= lx.CLONE_NEWNET
    listen_fds: tuple[int, ...] = ()
    cg_fd = None
    try:
        if spec.execd_sockets:
            listen_fds = tuple(usock.listen_unix(f"{spec.execd_sockets}/{name}") for name in EXECD_SOCKET_NAMES)
        cg_fd = os.open(cgroup.v2_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if cgroup.v2_dir else None
        pid = lx.clone3(flags, cg_fd)
    except OSError as exc:
        cg = [cg_fd] if cg_fd is not None else []
        for fd in (go_r, go_w, err_r, err_w, *log_fds, mounts_r, mounts_w, *listen_fds, *cg):
            os.close(fd)
        return -(exc.errno or 1), -1, -1, -1
    if pid == 0:
        for fd in (err_r, go_w, mounts_w, *close):
            os.close(fd)
        in_namespace_setup(spec, log_fds, err_w, go_r, mounts_r, listen_fds)  # never returns
    for fd in listen_fds:
        os.close(fd)  # PID 1 owns the listeners now: they live exactly as long as the sandbox's init
    for fd in (err_w, go_r, *log_fds, mounts_r, *([cg_fd] if cg_fd is not None else [])):
        os.close(fd)
    return pid, go_w, err_r, mounts_w


def _start_phase(spec: SpawnSpec) -> CpuPhase:
    """A started (or claimed) sandbox's first CPU phase: boosted until execd's Ready when it runs execd."""
    return CpuPhase.STARTING if spec.cpu_boost_seconds > 0 else CpuPhase.LIMITED


def _await_init(
    spec: SpawnSpec, pid: int, fifo_reads: list[int] | None, cgroup: SandboxCgroup, boost_end: float | None
) -> None:
    """Until the started init has ended (it is reaped after): pump its output (``fifo_reads``, closed here), and
    end its start-up boost at ``boost_end`` (``time.monotonic()``; None: not boosted).

    The boost's bound (``CpuPhase``): at ``boost_end`` the sandbox gets its quota, whether or not execd reported
    Ready (sandboxd sets it then, earlier; a second write of the same values changes nothing). Enforced here, not
    by sandboxd: the bound holds through a sandboxd restart. An init that exits first ends the wait (what else
    runs in the cgroup gets its quota now)."""
    cpu_millis = spec.resources.cpu_millis
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        pidfd = -1
    try:
        if fifo_reads is not None and pidfd >= 0:
            try:
                timer = (boost_end, lambda: _end_boost(cgroup, cpu_millis)) if boost_end is not None else None
                Pump(spec, fifo_reads).run(pidfd, timer)  # the boost ends in it (at its time or the init's end)
                return
            except Exception as exc:  # output is lost from here on (writers get EPIPE); the exit is still recorded
                print(f"output pump failed: {type(exc).__name__}: {exc}", flush=True)
        _close_all(fifo_reads)
        fifo_reads = None
        if boost_end is not None:  # (again, if the pump failed after it: the same values change nothing)
            if pidfd >= 0:
                select.select([pidfd], [], [], max(0.0, boost_end - time.monotonic()))
            _end_boost(cgroup, cpu_millis)
    finally:
        _close_all(fifo_reads)
        if pidfd >= 0:
            os.close(pidfd)


def _close_all(fds: list[int] | None) -> None:
    for fd in fds or ():
        with contextlib.suppress(OSError):
            os.close(fd)


def _end_boost(cgroup: SandboxCgroup, cpu_millis: int) -> None:
    """The sandbox's quota, the start-up boost over."""
    try:
        cgroup.set_cpu(CpuPhase.LIMITED, cpu_millis)
    except OSError as exc:  # the cgroup is gone (deleted meanwhile): nothing runs without its quota
        print(f"ending the start-up boost failed: {exc}", flush=True)


def _join_while(
    cgroup: SandboxCgroup,
    res: Limits,
    cpu: CpuPhase,
    pid: int,
    create_v1: bool,
    v2: bool,
    mounts: Callable[[], str | None],
) -> tuple[bool, str | None]:
    """``_join`` in a thread while ``mounts`` (building and sending the init's mounts, a veth) runs here:
    (joined, the mounts' error). The joins (cgroup2 move ~0.07 ms in the kernel, the v1 dirs, limits and moves)
    are done ~2.7 ms p50 into this, the mounts (ID maps, idmapped binds, the overlay) and the veth ~4.4 ms
    (docs/performance.md, "The cgroup join is not where the time goes"): they overlap instead of adding up. The
    thread is gone before this returns, and nothing here forks while it runs."""
    joined: list[bool] = []
    thread = threading.Thread(target=lambda: joined.append(_join(cgroup, res, cpu, pid, create_v1=create_v1, v2=v2)))
    thread.start()
    try:
        error = mounts()
    finally:
        thread.join()
    return bool(joined and joined[0]), error


def _join(cgroup: SandboxCgroup, res: Limits, cpu: CpuPhase, pid: int, *, create_v1: bool, v2: bool) -> bool:
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
            cgroup.create_v1(res.cpu_millis, res.memory_bytes, res.pids_max, cpu)
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


def _create_veth(veth: Veth, pid: int) -> bool:
    """Host end in the host namespace, peer ``eth0`` straight into the sandbox's (rtnetlink, in process)."""
    try:
        create_veth(veth.host_if, "eth0", pid, veth.host_ip, veth.prefix)
    except (OSError, ValueError) as exc:
        print(f"veth setup failed: {exc}", flush=True)
        return False
    return True


def _write_json_no_sync(path: str, value: NativeFile) -> None:
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
