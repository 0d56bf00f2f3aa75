"""How a sandbox runtime (sandboxd) starts execd as a sandbox's PID 1.

execd needs only the standard library of any Python >= 3.11 plus a handful of ADX modules, so a sandbox whose
image has ``python3`` (the default image binds the host's ``/usr``) can run it from a small directory:
:func:`install_runtime` copies exactly those modules; :func:`init_argv` builds the PID 1 command line.

Faster and smaller (measured by ``bench/bench_execd.py``): a single-threaded spawner that has already
imported :mod:`adx.execd._main` can, in the cloned child, call ``os._exit(adx.execd._main.main(argv))``
instead of exec'ing a new interpreter: first answer in ~6 ms instead of ~60 ms, and the imported code stays
shared copy-on-write with the spawner (~6 MiB private per sandbox instead of ~11 MiB). The spawner should
import it with ``sys.modules.setdefault("ssl", None)`` first, as ``python -m adx.execd`` does.
"""

from __future__ import annotations

import py_compile
import shutil
from collections.abc import Sequence
from pathlib import Path

__all__ = ["RUNTIME_MODULES", "init_argv", "install_runtime"]

#: The files ``python -m adx.execd`` imports (relative to the directory that holds the ``adx`` package).
RUNTIME_MODULES = (
    "adx/__init__.py",
    "adx/logs.py",
    "adx/execd/__init__.py",
    "adx/execd/__main__.py",
    "adx/execd/_main.py",
    "adx/execd/_daemon.py",
    "adx/execd/_http.py",
    "adx/execd/_files.py",
    "adx/execd/_procs.py",
    "adx/execd/_activity.py",
    "adx/execd/_control.py",
    "adx/execd/_protocol.py",
)

_SOURCE_ROOT = Path(__file__).resolve().parent.parent.parent


def install_runtime(dest: Path, *, compile_bytecode: bool = True) -> Path:
    """Copy execd's modules under ``dest`` (to be put on ``PYTHONPATH`` inside the sandbox); return ``dest``.

    With ``compile_bytecode`` the ``.pyc`` files are written too (valid for interpreters of this one's minor
    version, e.g. the image's python3.11): otherwise every sandbox start compiles them again (~100 ms).
    """
    for rel in RUNTIME_MODULES:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_SOURCE_ROOT / rel, target)
        if compile_bytecode:
            py_compile.compile(str(target), doraise=True)
    return dest


def init_argv(
    *,
    python: str = "python3",
    socket: str = "/run/adx/execd.sock",
    control_socket: str | None = "/run/adx/control.sock",
    sandbox_id: str = "",
    execution_id: str | None = None,
    workload: Sequence[str] = (),
    extra: Sequence[str] = (),
    pythonpath_only_for_execd: bool = True,
) -> list[str]:
    """The argv of execd as PID 1 (paths as seen inside the sandbox).

    ``pythonpath_only_for_execd``: the sandbox's PYTHONPATH points at execd's modules; keep it out of the
    workload's and commands' environment.
    """
    argv = [python, "-m", "adx.execd", "--socket", socket]
    if control_socket:
        argv += ["--control-socket", control_socket]
    if sandbox_id:
        argv += ["--sandbox-id", sandbox_id]
    if execution_id:
        argv += ["--execution-id", execution_id]
    if pythonpath_only_for_execd:
        argv += ["--unset-env", "PYTHONPATH"]
    argv += list(extra)
    if workload:
        argv += ["--", *workload]
    return argv
