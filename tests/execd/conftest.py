"""Fixtures: real execd processes (``python -m adx.execd``) on Unix sockets in short temp dirs.

Every process is started in its own session and killed as a group at teardown, even when the test failed.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from execd_helpers import ExecdProcess, execd_command


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temp dir with a short path: Unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ex", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def execd_factory(short_dir: Path) -> Iterator[Callable[..., ExecdProcess]]:
    """``start(*extra_args, prefix=[...], wait=True)``: a running execd; ``prefix`` wraps it (e.g. unshare)."""
    made: list[ExecdProcess] = []

    def start(*extra: str, prefix: list[str] | None = None, wait: bool = True, name: str = "") -> ExecdProcess:
        tag = name or str(len(made))
        socket, admin, log = short_dir / f"s{tag}", short_dir / f"a{tag}", short_dir / f"log{tag}"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*(prefix or []), *execd_command(socket, admin, "--grace-seconds", "2", *extra)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # teardown kills the whole group, stray children included
            )
        handle = ExecdProcess(proc, socket, admin, log)
        made.append(handle)
        if wait:
            handle.wait_ready()
        return handle

    yield start
    for handle in made:
        handle.stop()


@pytest.fixture
def execd(execd_factory: Callable[..., ExecdProcess]) -> ExecdProcess:
    return execd_factory()
