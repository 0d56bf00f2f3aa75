"""A warm pool member's execd, started before its sandbox is (issue 16): ``python3 -m adx.execd._prestart GO ERR``.

On a store image execd runs on the image's own ``python3``, which no host process can have imported ahead (the
host image's PID 1 runs execd in process instead, from the spawner's template). So a member of such a shape
execs this module as PID 1 once its namespaces, mounts and confinement are done — exactly where a cold start
execs ``python3 -m adx.execd ...`` — imports execd here, says so with a NUL byte on ``ERR`` (the member is ready
only then), and waits on ``GO`` for what the claim makes the sandbox's own: ``init_argv`` (execd's options, as
:func:`adx.execd._launch.init_argv` built them), ``env`` and ``cwd`` (the supervisor sets the host name from
outside, this process's capabilities being dropped). It then becomes what that exec would have started:
environment, working directory, ``/proc`` argv and environ, ``sys.argv``, and ``main`` of
:mod:`adx.execd.__main__` on the same argv. Closing ``ERR`` tells the supervisor it started (a cold start's
execve closes it); a setup error is written there instead.

When the claim asks for what an already running interpreter cannot become — another interpreter or entry, or an
environment that Python or libc read at start-up (:func:`startup_env`) — it execs the claim's argv, as a cold
start would have. EOF on ``GO`` without a claim: the member was dropped; exit.
"""

from __future__ import annotations

import json
import os
import signal
import sys

# As ``python -m adx.execd`` (its __main__): no ssl module (nor libssl) in a process that speaks only over Unix
# sockets. Then all of execd is imported: the work this module moves ahead of the claim.
sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]

import adx.execd.__main__ as entry  # noqa: E402
from adx.execd._main import main as execd_main  # noqa: E402
from adx.execd._process_args import ROOM_VARIABLE, set_process_args  # noqa: E402

__all__ = ["main", "startup_env"]

#: What the interpreter, the dynamic loader or libc read while starting (or at import), so a running process
#: cannot take them from a claim: ``PATH`` found the interpreter, ``HOME`` its user site, the locale its encodings.
_STARTUP_NAMES = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR"})
_STARTUP_PREFIXES = ("PYTHON", "LC_", "LD_", "GLIBC_", "MALLOC_")


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The part of ``env`` read at start-up: a claim is served in process only when it equals this process's."""
    return {k: v for k, v in env.items() if k in _STARTUP_NAMES or k.startswith(_STARTUP_PREFIXES)}


def _exec_env() -> dict[str, str]:
    """The environment this process was exec'd with (``os.environ`` may hold what start-up added)."""
    with open("/proc/self/environ", "rb") as f:
        items = f.read().split(b"\0")
    return dict(item.decode(errors="surrogateescape").partition("=")[::2] for item in items if b"=" in item)


def _read_to_eof(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def main(go_fd: int, err_fd: int) -> int:
    exec_env = _exec_env()
    exec_env.pop(ROOM_VARIABLE, None)
    os.environ.pop(ROOM_VARIABLE, None)
    # What the interpreter set itself while starting (PEP 538's LC_CTYPE): a cold start's execd has it too.
    added = {k: v for k, v in os.environ.items() if exec_env.get(k) != v}
    started_in = os.getcwd()
    os.write(err_fd, b"\0")  # imported: the member is ready
    data = _read_to_eof(go_fd)
    if not data:
        os._exit(0)  # dropped unclaimed
    try:
        claim = json.loads(data)
        argv, env, cwd = list(claim["init_argv"]), dict(claim["env"]), str(claim["cwd"])
        os.close(go_fd)
        os.chdir(cwd)
        if argv[:3] != [sys.orig_argv[0], "-m", "adx.execd"] or startup_env(env) != startup_env(exec_env):
            os.set_inheritable(err_fd, False)
            # Default, as the init left them for a cold start's exec (Python ignores them; an exec keeps that).
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)  # never returns
        os.environ.clear()
        os.environ.update(env)
        for key, value in added.items():
            os.environ.setdefault(key, value)
        set_process_args(argv, env)
        sys.argv = [str(entry.__file__), *argv[3:]]
        if sys.path and sys.path[0] == started_in:  # ``-m`` put the start's working directory first
            sys.path[0] = os.getcwd()
    except BaseException as exc:  # the supervisor reports the start as failed, naming this
        os.write(err_fd, f"{type(exc).__name__}: {exc}".encode()[:4000])
        os._exit(127)
    os.close(err_fd)  # started: where a cold start's execve closed it
    return execd_main(argv[3:])


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
