"""Crash-safe file primitives shared by every component that persists local state."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from adx.errors import ConflictError

if TYPE_CHECKING:  # not at run time: sandboxd's spawner template (every in-process execd) imports this module
    from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_json", "exclusive_lock", "fsync_dir"]


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old or the new content, never a mix.

    temp file in the same directory -> write -> fsync -> rename over -> fsync the directory.
    """
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_json(path: Path, value: Any, mode: int = 0o600) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=2, sort_keys=True).encode() + b"\n", mode)


@contextlib.contextmanager
def exclusive_lock(path: Path, *, timeout: float | None = None, what: str = "lock") -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600). ``timeout=None`` waits forever, 0 tries once.

    Raises :class:`ConflictError` when the lock is held elsewhere past the timeout.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if timeout is None else fcntl.LOCK_NB))
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise ConflictError(f"{what} {path} is held by another process") from None
                time.sleep(0.02)
        yield fd
    finally:
        os.close(fd)


class ShortUnixPath:
    """A connectable path for a Unix socket whose real path may exceed ``sun_path``'s 108 bytes.

    Holds an ``O_PATH`` descriptor of the socket's directory and names the socket through
    ``/proc/self/fd/<fd>/<name>``; close it when done. Short paths are passed through unchanged.
    """

    LIMIT = 107

    def __init__(self, path: Path) -> None:
        self._fd: int | None = None
        if len(os.fsencode(path)) <= self.LIMIT:
            self.path = str(path)
            return
        self._fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.path = f"/proc/self/fd/{self._fd}/{path.name}"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.close()
