"""Replacing a file whole inside the sandbox: a temp file beside it, renamed over it once complete, so a reader
sees the old file or the new one, never a mix (accounts' passwd/group/shadow, ``PUT /v1/files``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def create_temp(path: str, mode: int) -> int:
    """A new file (never an existing one: a leftover temp file of the same name is an error) open for writing."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)


@contextlib.contextmanager
def replacing(path: str, tmp: str, fd: int) -> Iterator[None]:
    """Write the new content to ``fd`` (of ``tmp``, from :func:`create_temp`) in the block, and fsync it there;
    the block's end closes it and renames ``tmp`` over ``path``. A failure anywhere removes ``tmp``."""
    try:
        try:
            yield
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
