"""The spawner: a single-threaded helper process that forks supervisors for sandboxd.

sandboxd is an asyncio daemon with executor threads; forking (let alone raw ``clone3``) from a threaded
process copies locks held by other threads. So sandboxd execs this small process at start (before anything
else), and asks it over a socketpair — newline-delimited JSON — to start sandboxes. For each request the
spawner hands the spec to a pre-forked idle child (a "zygote", in its own session) that becomes the sandbox's
supervisor (a plain zygote has cloned that sandbox's init while idle: ``_prepared_init.prepare_init``), and
forks the next zygote once that one has reported. Supervisors survive the spawner's and sandboxd's
exit (orphans are re-parented to init; the spawner reaps those that exit before it). A supervisor reports its
start result over a pipe that the spawner forwards, tagged with the request number.

With ``--execd`` (sandboxd starts the spawner with the interpreter execd sandboxes would exec), the spawner
forks, before it reads any request, a *template* that imports execd. A spec marked ``execd_inproc`` goes to a
zygote forked from that pristine copy, so its supervisor — and the sandbox's PID 1 it clones, which then runs
execd in process instead of exec'ing a fresh interpreter (``_in_namespace._become_execd``) — never holds another
sandbox's spec in its memory. Every other spec goes to a zygote forked here (smaller: no execd imported), with
``execd_inproc`` cleared, as does an execd spec when the template is gone.

With ``--userns`` (sandboxd's ``user_namespace`` is on) a prepared init is cloned into a user namespace of its
own; the supervisor writes its ID maps once the spec names the sandbox's range.

Protocol: request ``{"req": n, "spec": {...}}``; reply ``{"req": n, "ok": bool, ...}``. EOF on the control
socket ends the spawner (it never outlives its daemon).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import socket
import sys
from dataclasses import dataclass, replace
from typing import NoReturn

from adx.sandboxd._cgroups import CgroupLayout, detect_layout
from adx.sandboxd._prepared_init import PreparedInit, prepare_init
from adx.sandboxd._sandbox_layout import SUPERVISOR_LOG
from adx.sandboxd._spawn_spec import SpawnReport, SpawnSpec, read_to_eof
from adx.sandboxd._supervisor import run_supervisor

__all__ = ["main"]

#: ``--userns``: prepared inits get a user namespace of their own (set once in main, before any fork).
_USERNS = False


@dataclass
class _Zygote:
    """A pre-forked, idle supervisor-to-be: forking it off the critical path saves a fork per create."""

    spec_w: int  # the spec goes here (then closed)
    result_r: int  # its start report comes back here


def _zygote_main(spec_r: int, result_w: int, layout: CgroupLayout, prepare: bool) -> NoReturn:
    """The zygote: waits for one spec, then becomes its supervisor. ``prepare``: clone the sandbox's init
    meanwhile (not in the template's zygotes: their specs' execd sockets are bound before the init exists)."""
    code = 1
    try:
        _detach(keep=(spec_r, result_w))  # while idle: none of this waits for a spec
        init = prepare_init(close=(spec_r, result_w), userns=_USERNS) if prepare else None
        data = read_to_eof(spec_r)
        # EOF without a spec: the spawner is gone or replaced us; just exit.
        code = _supervisor_main(SpawnSpec.from_json(data), layout, result_w, init) if data else 0
    finally:
        os._exit(code)


def _fork_zygote(layout: CgroupLayout, ctrl_fd: int) -> _Zygote:
    spec_r, spec_w = os.pipe2(os.O_CLOEXEC)
    result_r, result_w = os.pipe2(os.O_CLOEXEC)
    if os.fork() == 0:
        _zygote_main(spec_r, result_w, layout, True)  # closes every other descriptor (ctrl_fd, spec_w, ...)
    os.close(spec_r)
    os.close(result_w)
    return _Zygote(spec_w, result_r)


class _Template:
    """A copy of the spawner forked before it read any request; it forks the pristine zygotes on demand.

    The spawner passes it each zygote's two pipe ends (SCM_RIGHTS); its children are reaped by the kernel.
    It exits when the spawner's end of its socket closes.
    """

    def __init__(self, layout: CgroupLayout, ctrl_fd: int) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.close(ctrl_fd)
                self.sock.close()
                sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]  # as ``python -m adx.execd`` does
                import adx.execd._main  # noqa: F401 - what PID 1 runs in process (here only: plain zygotes stay small)

                _template_loop(theirs, layout)
                code = 0
            finally:
                os._exit(code)
        theirs.close()

    def fork_zygote(self) -> _Zygote:
        """OSError when the template is gone."""
        spec_r, spec_w = os.pipe2(os.O_CLOEXEC)
        result_r, result_w = os.pipe2(os.O_CLOEXEC)
        try:
            socket.send_fds(self.sock, [b"z"], [spec_r, result_w])
        except OSError:
            os.close(spec_w)
            os.close(result_r)
            raise
        finally:
            os.close(spec_r)
            os.close(result_w)
        return _Zygote(spec_w, result_r)


def _template_loop(sock: socket.socket, layout: CgroupLayout) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # zygotes (supervisors) are reaped by the kernel
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 16, 2)
        if not msg:
            return  # the spawner is gone
        spec_r, result_w = fds
        for fd in fds:
            os.set_inheritable(fd, False)  # received without close-on-exec: the workload must not hold them
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the supervisor waits for its own child
            sock.close()
            _zygote_main(spec_r, result_w, layout, False)
        os.close(spec_r)
        os.close(result_w)


def _detach(keep: tuple[int, ...]) -> None:
    """Make a zygote a supervisor-to-be: own session, stdin on /dev/null, ignored terminal signals, and no
    descriptor inherited from the spawner but ``keep`` (other requests' pipes, the control socket): a supervisor
    must hold nothing of sandboxd's, or sandboxd's restart would find its resources busy."""
    os.setsid()  # own session: no terminal signals, not in sandboxd's process group
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    prev = 2
    for fd in sorted({*keep, 65536}):
        if fd > prev:
            os.closerange(prev + 1, fd)
            prev = fd
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _hand_off(zygote: _Zygote, spec: SpawnSpec) -> int:
    """Give the spec to the zygote; return the read end of its result pipe. OSError if it is gone."""
    data = spec.to_json()
    try:
        while data:
            data = data[os.write(zygote.spec_w, data) :]
    except OSError:
        os.close(zygote.result_r)
        raise
    finally:
        os.close(zygote.spec_w)
    return zygote.result_r


def _reap() -> None:
    """Collect exited supervisors (a single fork is faster than double-forking; we reap instead)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _supervisor_main(spec: SpawnSpec, layout: CgroupLayout, result_fd: int, init: PreparedInit | None) -> int:
    log = os.open(f"{spec.sandbox_dir}/{SUPERVISOR_LOG}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    try:
        return run_supervisor(spec, layout, result_fd, init)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(result_fd, json.dumps({"ok": False, "error": f"supervisor crashed: {exc!r}"}).encode())
        import traceback

        traceback.print_exc()
        return 1


class _Idle:
    """The idle zygotes: one forked here for most sandboxes, one from the template (if any) for a sandbox whose
    PID 1 runs execd in process — forked here, a zygote's memory may hold other sandboxes' specs."""

    def __init__(self, layout: CgroupLayout, ctrl_fd: int, template: _Template | None) -> None:
        self.layout, self.ctrl_fd, self.template = layout, ctrl_fd, template
        self.plain: _Zygote | None = None
        self.pristine: _Zygote | None = None
        self.refill()

    def refill(self) -> None:
        """Fork what is missing (once a started supervisor has reported, or at a hand-off that finds none)."""
        if self.plain is None:
            self.plain = _fork_zygote(self.layout, self.ctrl_fd)
        if self.pristine is None and self.template is not None:
            try:
                self.pristine = self.template.fork_zygote()
            except OSError as exc:
                print(f"spawner: the zygote template is gone ({exc}); execd sandboxes exec execd", file=sys.stderr)
                self.template.sock.close()
                self.template = None

    def hand_off(self, spec: SpawnSpec) -> int:
        """The read end of the report pipe of the zygote that got ``spec``; OSError when none could take it."""
        self.refill()
        if spec.execd_inproc and self.pristine is not None:
            pristine, self.pristine = self.pristine, None
            with contextlib.suppress(OSError):  # it died: a plain zygote starts the sandbox, exec'ing execd
                return _hand_off(pristine, spec)
        spec = replace(spec, execd_inproc=False)
        plain, self.plain = self.plain, None
        assert plain is not None
        try:
            return _hand_off(plain, spec)
        except OSError:  # the idle zygote died (killed?): use a fresh one once
            return _hand_off(_fork_zygote(self.layout, self.ctrl_fd), spec)


def main() -> int:
    global _USERNS
    ctrl_fd = int(sys.argv[1])
    _USERNS = "--userns" in sys.argv[2:]
    os.set_blocking(ctrl_fd, True)
    layout = detect_layout()
    # Before any request: nothing of any sandbox's is in the template.
    template = _Template(layout, ctrl_fd) if "--execd" in sys.argv[2:] else None
    sel = selectors.DefaultSelector()
    sel.register(ctrl_fd, selectors.EVENT_READ, None)
    pending: dict[int, tuple[int, list[bytes]]] = {}  # pipe fd -> (req, chunks)
    buf = b""
    idle = _Idle(layout, ctrl_fd, template)

    def send(payload: SpawnReport) -> None:
        data = json.dumps(payload).encode() + b"\n"
        while data:
            data = data[os.write(ctrl_fd, data) :]

    while True:
        _reap()
        for key, _ in sel.select(timeout=1.0):
            fd = key.fd
            if fd == ctrl_fd:
                chunk = os.read(ctrl_fd, 1 << 16)
                if not chunk:
                    return 0  # sandboxd went away; supervisors live on
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    try:
                        pipe = idle.hand_off(SpawnSpec.from_wire(msg["spec"]))
                        if "spawner.after_handoff" in os.environ.get("ADX_SANDBOXD_FAULTS", "").split(","):
                            # Test-only fault point: IPC lost mid-create, once the supervisor has reported (so
                            # the sandbox did start, whatever sandboxd records when it sees the spawner gone).
                            select.select([pipe], [], [], 10.0)
                            os.kill(os.getpid(), signal.SIGKILL)
                    except OSError as exc:
                        send({"req": msg["req"], "ok": False, "error": f"fork failed: {exc}"})
                        continue
                    pending[pipe] = (msg["req"], [])
                    sel.register(pipe, selectors.EVENT_READ, None)
            else:
                req, chunks = pending[fd]
                data = os.read(fd, 1 << 16)
                if data:
                    chunks.append(data)
                    continue
                sel.unregister(fd)
                os.close(fd)
                del pending[fd]
                raw = b"".join(chunks)
                result: SpawnReport
                try:
                    result = json.loads(raw) if raw else {"ok": False, "error": "supervisor exited before starting"}
                except ValueError:
                    result = {"ok": False, "error": f"garbled supervisor reply: {raw[:200]!r}"}
                send({**result, "req": req})
                # Only now (not right after the hand-off): a fork here would compete for the CPU with the
                # supervisor's start; hand_off forks one itself if a request comes first.
                idle.refill()


if __name__ == "__main__":
    sys.exit(main())
