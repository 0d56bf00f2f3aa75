"""What wakes a Wait call: inotify events and in-process record changes, instead of a poll per sandbox.

The node keeps one Wait open on every running sandbox (it learns the workload's exit from it). A Wait used to
poll: a ``stat`` of the sandbox's exit record every 20 ms and the full native query (a worker thread) every
second, per sandbox. With 200 idle sandboxes that was 27 % of a core in sandboxd's main process (py-spy: the
``stat`` 24 % of its samples, the queries' threads 28 %), and it grew with every sandbox (bench_density, 500
idle: 1.04 ms of sandboxd CPU per second per Environment).

Now a Wait sleeps until something it must look at may have changed:

- the supervisor renames ``exit.json`` into the sandbox's directory (an inotify watch on the directory);
- the sandbox's cgroup2 ``cgroup.events`` changes (``populated`` drops to 0 when the last process ends, even
  with no supervisor left to write the exit record; ``frozen`` flips): the kernel notifies it as a modification;
  its removal ends the watch (``IN_IGNORED``), which wakes the Wait too;
- sandboxd changes or forgets the record itself (``RecordTable`` below), from the loop or from a worker thread;
- the inotify queue overflowed: every Wait wakes.

The full native query still runs now and then as a safety net (``full_check_seconds``): every 10 s where both
watches are in place, every second where they are not (no cgroup2, a watch refused), as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping

from adx.sandboxd._linux import libc
from adx.sandboxd._models import SandboxRecord

log = logging.getLogger("adx.sandboxd")

__all__ = ["RecordTable", "WaitSubscription", "WaitWatch"]

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_MODIFY = 0x00000002
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE_SELF = 0x00000400
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name, NUL-padded)

#: The full native query of a Wait whose sandbox is watched: only what no event shows (none is known) is left
#: to it, so it is rare; an unwatched Wait queries every second, as all did before.
WATCHED_FULL_CHECK_SECONDS = 10.0
UNWATCHED_FULL_CHECK_SECONDS = 1.0

libc.inotify_init1.argtypes = [ctypes.c_int]
libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


class WaitSubscription:
    """One Wait's wake-up: ``fired`` until the Wait looks (``clear``), and how often its full query runs."""

    def __init__(self, sandbox_id: str, watched: bool) -> None:
        self.sandbox_id = sandbox_id
        self.full_check_seconds = WATCHED_FULL_CHECK_SECONDS if watched else UNWATCHED_FULL_CHECK_SECONDS
        self._event = asyncio.Event()

    @property
    def fired(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        self._event.clear()

    def fire(self) -> None:
        self._event.set()

    async def sleep(self, seconds: float) -> None:
        """Until fired or ``seconds`` passed."""
        if seconds > 0 and not self._event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), seconds)


class _Watched:
    def __init__(self, wds: list[int]) -> None:
        self.wds = wds
        self.subscriptions: set[WaitSubscription] = set()


class WaitWatch:
    """One inotify descriptor for the daemon, read on its event loop; watches exist while a Wait is subscribed."""

    def __init__(self, exit_name: str) -> None:
        self._exit_name = exit_name.encode()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._fd: int | None = None
        self._watched: dict[str, _Watched] = {}
        self._by_wd: dict[int, str] = {}

    def subscribe(self, sandbox_id: str, sandbox_dir: str, cgroup_events: str | None) -> WaitSubscription:
        """Called on the event loop. Watches ``sandbox_dir`` for the exit record and ``cgroup_events`` (a cgroup2
        ``cgroup.events``; None where there is none) while any Wait of the sandbox is subscribed."""
        self._attach()
        watched = self._watched.get(sandbox_id)
        if watched is None:
            wds = self._add(sandbox_dir, _IN_MOVED_TO | _IN_CREATE | _IN_CLOSE_WRITE | _IN_DELETE_SELF | _IN_ONLYDIR)
            if cgroup_events is not None:
                wds += self._add(cgroup_events, _IN_MODIFY | _IN_DELETE_SELF)
            watched = self._watched[sandbox_id] = _Watched(wds)
            for wd in wds:
                self._by_wd[wd] = sandbox_id
        sub = WaitSubscription(sandbox_id, watched=len(watched.wds) == 2)
        watched.subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: WaitSubscription) -> None:
        watched = self._watched.get(sub.sandbox_id)
        if watched is None:
            return
        watched.subscriptions.discard(sub)
        if watched.subscriptions:
            return
        del self._watched[sub.sandbox_id]
        for wd in watched.wds:
            self._by_wd.pop(wd, None)
            if self._fd is not None:
                libc.inotify_rm_watch(self._fd, wd)  # EINVAL when the kernel ended it already (IN_IGNORED)

    def poke(self, sandbox_id: str) -> None:
        """The record of ``sandbox_id`` changed in this process: wake its Waits (from any thread)."""
        loop = self._loop
        if loop is None or sandbox_id not in self._watched:
            return
        if threading.get_ident() == self._loop_thread:
            self._fire(sandbox_id)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closing: no Wait is left to wake
                loop.call_soon_threadsafe(self._fire, sandbox_id)

    def _attach(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            log.warning("inotify unavailable (%s): each Wait queries its sandbox every second", os.strerror(err))
            return
        self._fd = fd
        self._loop.add_reader(fd, self._drain)

    def _add(self, path: str, mask: int) -> list[int]:
        if self._fd is None:
            return []
        wd = libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            if err != errno.ENOENT:  # gone already: the first full query says so
                log.warning("no inotify watch on %s (%s): its Waits query every second", path, os.strerror(err))
            return []
        return [wd]

    def _fire(self, sandbox_id: str) -> None:
        watched = self._watched.get(sandbox_id)
        for sub in watched.subscriptions if watched is not None else ():
            sub.fire()

    def _drain(self) -> None:
        assert self._fd is not None
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return
            if not data:
                return
            for sandbox_id in self._woken(data):
                self._fire(sandbox_id)

    def _woken(self, data: bytes) -> Iterable[str]:
        woken: set[str] = set()
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            if mask & _IN_Q_OVERFLOW:
                return set(self._watched)
            sandbox_id = self._by_wd.get(wd)
            if sandbox_id is None:
                continue
            if mask & _IN_IGNORED:
                self._by_wd.pop(wd, None)  # the watched file or directory is gone: the watch ended with it
                watched = self._watched.get(sandbox_id)
                if watched is not None and wd in watched.wds:
                    watched.wds.remove(wd)
                    # What is left unwatched falls back to the query every second.
                    for sub in watched.subscriptions:
                        sub.full_check_seconds = UNWATCHED_FULL_CHECK_SECONDS
                woken.add(sandbox_id)
            elif not name or name == self._exit_name:
                woken.add(sandbox_id)
        return woken


class RecordTable(dict[str, SandboxRecord]):
    """sandboxd's records by sandbox ID; every change (set, delete, pop) wakes that sandbox's Waits."""

    def __init__(self, changed: Callable[[str], None], records: Mapping[str, SandboxRecord] | None = None) -> None:
        super().__init__(records or {})
        self._changed = changed

    def __setitem__(self, sandbox_id: str, record: SandboxRecord) -> None:
        super().__setitem__(sandbox_id, record)
        self._changed(sandbox_id)

    def __delitem__(self, sandbox_id: str) -> None:
        super().__delitem__(sandbox_id)
        self._changed(sandbox_id)

    def pop(self, sandbox_id: str, *default: SandboxRecord | None) -> SandboxRecord | None:  # type: ignore[override]
        record = super().pop(sandbox_id, *default)
        self._changed(sandbox_id)
        return record
