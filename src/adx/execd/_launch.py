"""How a sandbox runtime (sandboxd) starts execd as a sandbox's PID 1.

execd needs only the standard library of any Python >= 3.11 plus a handful of ADX modules, so a sandbox whose
image has ``python3`` (the default image binds the host's ``/usr``) can run it from a small directory:
:func:`install_runtime` copies exactly those modules; :func:`init_argv` builds the PID 1 command line.

sandboxd does better when it can (``execd_in_process``, see ``adx.sandboxd._spawner``): its spawner runs the
interpreter the sandbox would exec, imports :mod:`adx.execd._main` (after ``sys.modules.setdefault("ssl",
None)``, as ``python -m adx.execd`` does) and PID 1 calls ``main(argv[3:])`` in the cloned child instead of
exec'ing: create -> Ready ~20 ms instead of ~70 ms (``bench/bench_execd.py --sandboxes``), and the imported
code stays shared copy-on-write (~6 MiB private per sandbox instead of ~10 MiB). The runtime installed here
still serves that PID 1's later imports and every sandbox that execs execd.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
from pathlib import Path

from adx.execd._options import ExecdOptions, to_argv

__all__ = ["RUNTIME_MODULES", "init_argv", "install_runtime"]

#: The files ``python -m adx.execd`` imports (relative to the directory that holds the ``adx`` package).
RUNTIME_MODULES = (
    "adx/__init__.py",
    "adx/_backoff.py",
    "adx/logs.py",
    "adx/execd/__init__.py",
    "adx/execd/__main__.py",
    "adx/execd/_main.py",
    "adx/execd/_options.py",
    "adx/execd/_daemon.py",
    "adx/execd/_accounts.py",
    "adx/execd/_atomic.py",
    "adx/execd/_commands.py",
    "adx/execd/_http.py",
    "adx/execd/_files.py",
    "adx/execd/_procs.py",
    "adx/execd/_activity.py",
    "adx/execd/_control.py",
    "adx/execd/_protocol.py",
    "adx/execd/_watch.py",
    "adx/execd/_process_args.py",
    "adx/execd/_prestart.py",
)

_SOURCE_ROOT = Path(__file__).resolve().parent.parent.parent


def install_runtime(dest: Path, *, compile_bytecode: bool = True) -> Path:
    """Copy execd's modules under ``dest`` (to be put on ``PYTHONPATH`` inside the sandbox); return ``dest``.

    With ``compile_bytecode`` the ``.pyc`` files are written too (valid for interpreters of this one's minor
    version, e.g. the image's python3.11): otherwise every sandbox start compiles them again (~100 ms).

    Safe while sandboxes use ``dest`` (sandboxd re-installs at every start): unchanged files are left alone and
    a changed one is replaced by rename, so an execd importing at that moment reads a whole old or new file.
    """
    for rel in RUNTIME_MODULES:
        source = (_SOURCE_ROOT / rel).read_bytes()
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            unchanged = target.read_bytes() == source
        except FileNotFoundError:
            unchanged = False
        if not unchanged:
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_bytes(source)
            os.replace(tmp, target)
        if compile_bytecode and not (unchanged and Path(importlib.util.cache_from_source(str(target))).exists()):
            py_compile.compile(str(target), doraise=True)  # writes the .pyc atomically itself
    return dest


def init_argv(options: ExecdOptions, *, python: str = "python3") -> list[str]:
    """The argv of execd as PID 1 (paths as seen inside the sandbox): ``python -m adx.execd`` and the options.

    sandboxd starts execd with socket activation (``socket_fd`` / ``admin_socket_fd``): it binds and listens on
    the sockets at host-only paths and hands PID 1 the listening descriptors, since a path inside the sandbox
    would be replaceable from inside. It also puts ``PYTHONPATH`` (execd's modules) in ``unset_env``, to keep it
    out of the workload's and commands' environment.
    """
    return [python, "-m", "adx.execd", *to_argv(options)]
