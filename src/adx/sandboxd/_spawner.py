"""The spawner: a single-threaded helper process that forks supervisors for sandboxd.

sandboxd is an asyncio daemon with executor threads; forking (let alone raw ``clone3``) from a threaded
process copies locks held by other threads. So sandboxd execs this small process at start (before anything
else), and asks it over a socketpair — newline-delimited JSON — to start sandboxes. For each request the
spawner hands the spec to a pre-forked idle child (a "zygote", in its own session) that becomes the sandbox's
supervisor, and forks the next zygote while that one works. Supervisors survive the spawner's and sandboxd's
exit (orphans are re-parented to init; the spawner reaps those that exit before it). A supervisor reports its
start result over a pipe that the spawner forwards, tagged with the request number.

Protocol: request ``{"req": n, "spec": {...}}``; reply ``{"req": n, "ok": bool, ...}``. EOF on the control
socket ends the spawner (it never outlives its daemon).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import sys
from dataclasses import dataclass
from typing import Any

from adx.sandboxd._cgroups import CgroupLayout, detect_layout
from adx.sandboxd._supervisor import run_supervisor

__all__ = ["main"]


@dataclass
class _Zygote:
    """A pre-forked, idle supervisor-to-be: forking it off the critical path saves a fork per create."""

    pid: int
    spec_w: int  # the spec goes here (then closed)
    result_r: int  # its start report comes back here


def _fork_zygote(layout: CgroupLayout, ctrl_fd: int) -> _Zygote:
    spec_r, spec_w = os.pipe2(os.O_CLOEXEC)
    result_r, result_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the zygote: waits for one spec, then becomes its supervisor
        code = 1
        try:
            os.close(spec_w)
            os.close(result_r)
            os.close(ctrl_fd)
            _detach(keep=(spec_r, result_w))  # while idle: none of this waits for a spec
            chunks = []
            while chunk := os.read(spec_r, 1 << 16):
                chunks.append(chunk)
            os.close(spec_r)
            # EOF without a spec: the spawner is gone or replaced us; just exit.
            code = _supervisor_main(json.loads(b"".join(chunks)), layout, result_w) if chunks else 0
        finally:
            os._exit(code)
    os.close(spec_r)
    os.close(result_w)
    return _Zygote(pid, spec_w, result_r)


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


def _hand_off(zygote: _Zygote, spec: dict[str, Any]) -> int:
    """Give the spec to the zygote; return the read end of its result pipe. OSError if it is gone."""
    data = json.dumps(spec).encode()
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


def _supervisor_main(spec: dict[str, Any], layout: CgroupLayout, result_fd: int) -> int:
    log = os.open(f"{spec['sandbox_dir']}/supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    try:
        return run_supervisor(spec, layout, result_fd)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(result_fd, json.dumps({"ok": False, "error": f"supervisor crashed: {exc!r}"}).encode())
        import traceback

        traceback.print_exc()
        return 1


def main() -> int:
    ctrl_fd = int(sys.argv[1])
    os.set_blocking(ctrl_fd, True)
    layout = detect_layout()
    sel = selectors.DefaultSelector()
    sel.register(ctrl_fd, selectors.EVENT_READ, None)
    pending: dict[int, tuple[int, list[bytes]]] = {}  # pipe fd -> (req, chunks)
    buf = b""
    zygote = _fork_zygote(layout, ctrl_fd)

    def send(payload: dict[str, Any]) -> None:
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
                        try:
                            pipe = _hand_off(zygote, msg["spec"])
                        except OSError:  # the idle zygote died (killed?): use a fresh one once
                            pipe = _hand_off(_fork_zygote(layout, ctrl_fd), msg["spec"])
                        if "spawner.after_handoff" in os.environ.get("ADX_SANDBOXD_FAULTS", "").split(","):
                            os.kill(os.getpid(), signal.SIGKILL)  # test-only fault point: IPC lost mid-create
                        # The replacement forks while the supervisor works (on the other CPU, if any).
                        zygote = _fork_zygote(layout, ctrl_fd)
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
                try:
                    result = json.loads(raw) if raw else {"ok": False, "error": "supervisor exited before starting"}
                except ValueError:
                    result = {"ok": False, "error": f"garbled supervisor reply: {raw[:200]!r}"}
                send({"req": req, **result})


if __name__ == "__main__":
    sys.exit(main())
