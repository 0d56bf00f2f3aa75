"""A new sandbox's directory, its subdirs and its lifecycle lock, mostly from a small pool of spare dirs.

A spare is a dir made ahead (off any create's path) with every subdir and empty file a create needs and its
lifecycle lock held: a create renames one into place, one rename on the loop.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import threading
from pathlib import Path

from adx.sandboxd._registry import RECORD_TEMP, Registry
from adx.sandboxd._sandbox_layout import CONTROL_DIR, LOCK_FILE, NATIVE_TEMP, OUTPUT_LOG, SOCKETS_DIR, SUPERVISOR_LOG

__all__ = ["SpareDirs"]

log = logging.getLogger("adx.sandboxd")

#: Every sandbox dir's subdirs (execd sandboxes add SOCKETS_DIR and CONTROL_DIR), pre-made in spare dirs.
_SPARE_NAMES = ["upper", "ovlwork", "rootfs", "run"]
#: The upper dir's mode is the sandbox root's ("/"): 0700 would lock every non-root user out of everything.
_WORLD_READABLE = ("run", "upper")
#: ... and the files a create makes (the record's temp file; the supervisor's log, workload output and identity
#: temp file), pre-made empty in spare dirs: each is then an open, not an inode creation.
_SPARE_FILES = [RECORD_TEMP, SUPERVISOR_LOG, OUTPUT_LOG, NATIVE_TEMP]
_SPARES = 2


class SpareDirs:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._spares: list[tuple[Path, int]] = []  # spare sandbox dirs, each with its lifecycle lock held
        self._refilling: asyncio.Task[None] | None = None

    def prepare(self, sandbox_id: str, execd: bool) -> int:
        """The sandbox's dir, its subdirs and its lifecycle lock, held: the returned descriptor.

        A spare dir renamed into place (one rename on the loop; the pool is refilled after the create), or made
        here when none is left. The lock holds the supervisor back until the record is committed
        (``_commit_created``), so the start can be requested before the commit is done.
        """
        spare = self._spares.pop() if self._spares else None
        try:
            # FileExistsError: the ID was used before
            sdir = self.registry.reserve_dir(sandbox_id, spare[0] if spare else None)
        except BaseException:
            if spare is not None:
                self._spares.append(spare)
            raise
        names = [] if spare is not None else list(_SPARE_NAMES)
        if execd:
            names += [SOCKETS_DIR, CONTROL_DIR]  # host-only: never mounted writable into the sandbox
        lock_fd = spare[1] if spare is not None else None
        try:
            for name in names:
                (sdir / name).mkdir(mode=0o755 if name in _WORLD_READABLE else 0o700)
            if lock_fd is None:
                lock_fd = os.open(sdir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a new file: nobody else holds it
        except OSError:
            if lock_fd is not None:
                os.close(lock_fd)
            shutil.rmtree(sdir, ignore_errors=True)  # ours, fresh, holding no record
            raise
        return lock_fd

    def make_named(self, name: str, execd: bool) -> tuple[Path, int]:
        """A spare-like dir named ``name`` for a warm pool member (never in this pool): its lock held."""
        names = [*_SPARE_NAMES, SOCKETS_DIR, CONTROL_DIR] if execd else _SPARE_NAMES
        return self.registry.make_spare(names, _SPARE_FILES, name)

    def fill(self) -> None:
        """At startup (synchronous)."""
        while len(self._spares) < _SPARES:
            try:
                self._spares.append(self.registry.make_spare(_SPARE_NAMES, _SPARE_FILES))
            except OSError as exc:
                log.warning("cannot make a spare sandbox dir (creates make theirs): %s", exc)
                return

    def refill_soon(self) -> None:
        """After a create (off its path): a task refills the pool unless one is at it already."""
        if len(self._spares) < _SPARES and (self._refilling is None or self._refilling.done()):
            self._refilling = asyncio.create_task(self._refill(), name="spare-dirs")

    def _make_spare_niced(self) -> tuple[Path, int]:
        """``make_spare`` at nice 19 (this worker thread only, restored after): on a busy host the next create's
        own work goes first (its dir comes from the pool; a create with none left makes its own)."""
        tid = threading.get_native_id()
        old = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, 19)
        try:
            return self.registry.make_spare(_SPARE_NAMES, _SPARE_FILES)
        finally:
            os.setpriority(os.PRIO_PROCESS, tid, old)

    async def _refill(self) -> None:
        """One spare at a time, in a thread."""
        while len(self._spares) < _SPARES:
            try:
                spare = await asyncio.to_thread(self._make_spare_niced)
            except OSError as exc:
                log.warning("cannot make a spare sandbox dir (creates make theirs): %s", exc)
                return
            self._spares.append(spare)
