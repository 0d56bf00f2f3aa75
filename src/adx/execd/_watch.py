"""Directory watchers on one inotify instance per sandbox (envd's ``WatchDir`` / ``CreateWatcher`` underneath).

Standard library only, hand-written: execd's idle memory is paid per sandbox. ``ctypes`` (inotify has no ``os``
call) is imported on the first watcher, so a sandbox that never watches pays nothing for it.

Event names are relative to the watched directory (``sub/file``), as envd reports them; the kinds follow
fsnotify's mapping that envd uses (create, write, remove, rename, chmod). A recursive watcher adds every
directory created under it as it appears.

Bounds, each a clear error rather than silent loss:

- :data:`MAX_WATCHERS` per sandbox: one more is refused (429 ``too_many_watchers``);
- :data:`MAX_DIRS` watched directories per sandbox: a watcher that would pass it is refused at creation, and a
  recursive watcher that grows past it is marked lost;
- :data:`MAX_EVENTS` queued per watcher not yet fetched, and the kernel's own queue (``IN_Q_OVERFLOW``): the
  watcher is marked lost; its next fetch answers 409 ``watcher_overflow`` (the client re-creates it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections import deque
from typing import Any, TypedDict

from adx.execd._accounts import Names, under_home
from adx.execd._files import FileDescription, describe
from adx.execd._http import HttpError, Request, Response, account, invalid

__all__ = ["MAX_DIRS", "MAX_EVENTS", "MAX_WATCHERS", "Watchers", "handle_watchers"]

MAX_WATCHERS = 128
MAX_DIRS = 8192
MAX_EVENTS = 16384

_IN_MODIFY, _IN_ATTRIB = 0x2, 0x4
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF = 0x400, 0x800
_IN_Q_OVERFLOW, _IN_IGNORED, _IN_ONLYDIR, _IN_ISDIR = 0x4000, 0x8000, 0x01000000, 0x40000000
_MASK = (
    _IN_MODIFY | _IN_ATTRIB | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF
)
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)

#: fsnotify's mapping (what envd reports): a move into the dir is a create, a move out a rename.
_KINDS = (
    (_IN_CREATE | _IN_MOVED_TO, "create"),
    (_IN_MODIFY, "write"),
    (_IN_DELETE | _IN_DELETE_SELF, "remove"),
    (_IN_MOVED_FROM | _IN_MOVE_SELF, "rename"),
    (_IN_ATTRIB, "chmod"),
)


#: The kinds whose event carries the entry when asked (envd's ``opCarriesEntry``): after a remove or a rename the
#: path names no longer that entry (a stat could describe a replacement made since).
_CARRY_ENTRY = frozenset({"create", "write", "chmod"})


class WatchEvent(TypedDict, total=False):
    """One event as ``GET /v1/watchers/{id}/events`` answers it; ``entry`` (the path's stat, as
    ``/v1/files/stat`` answers it) only for a watcher made with ``entries`` and a kind that carries one, and
    absent when the path was gone by the time the event was read."""

    type: str
    name: str
    entry: _Entry


class _Entry(FileDescription):
    path: str


class _Watcher:
    def __init__(self, wid: str, root: str, recursive: bool, entries: bool = False) -> None:
        self.id = wid
        self.root = root
        self.recursive = recursive
        self.entries = entries  # events carry the entry's stat (envd's include_entry)
        self.events: deque[WatchEvent] = deque()
        self.lost: str | None = None  # why events were lost (then every fetch fails)
        self.wds: set[int] = set()
        self.changed = asyncio.Event()


class Watchers:
    """All watchers of this sandbox on one inotify descriptor."""

    def __init__(self) -> None:
        self._fd = -1
        self._libc: Any = None
        self._watchers: dict[str, _Watcher] = {}
        # wd -> {watcher id: the directory's path relative to that watcher's root ("" for the root)}
        self._holders: dict[int, dict[str, str]] = {}

    def _open(self) -> None:
        if self._fd >= 0:
            return
        import ctypes  # only when watching: ~1 MiB a never-watching sandbox does not pay

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise HttpError(503, "watch_unavailable", f"inotify_init1: {os.strerror(err)}")
        self._libc, self._fd = libc, fd
        asyncio.get_running_loop().add_reader(fd, self._read)

    def _add(self, watcher: _Watcher, path: str, rel: str) -> bool:
        """Watch one directory for ``watcher``; False when the sandbox's directory bound is reached."""
        if len(self._holders) >= MAX_DIRS:
            return False
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _MASK | _IN_ONLYDIR)
        if wd < 0:
            return True  # gone or not a directory any more (a race with its removal): nothing to watch
        self._holders.setdefault(wd, {})[watcher.id] = rel
        watcher.wds.add(wd)
        return True

    def _add_tree(self, watcher: _Watcher, path: str, rel: str) -> bool:
        if not self._add(watcher, path, rel):
            return False
        if not watcher.recursive:
            return True
        try:
            entries = list(os.scandir(path))
        except OSError:
            return True
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                child_rel = f"{rel}/{entry.name}" if rel else entry.name
                if not self._add_tree(watcher, entry.path, child_rel):
                    return False
        return True

    def create(self, path: Any, recursive: Any, entries: Any = False) -> str:
        if not isinstance(path, str) or not path.startswith("/"):
            raise invalid("path", "required absolute path")
        if not isinstance(recursive, bool):
            raise invalid("recursive", "must be a boolean")
        if not isinstance(entries, bool):
            raise invalid("entries", "must be a boolean")
        if not os.path.exists(path):
            raise HttpError(404, "not_found", f"path {path!r} not found", {"field": "path"})
        if not os.path.isdir(path):
            raise invalid("path", f"{path!r} is not a directory")
        if len(self._watchers) >= MAX_WATCHERS:
            raise HttpError(
                429, "too_many_watchers", f"this sandbox already has {MAX_WATCHERS} watchers; remove one first"
            )
        self._open()
        watcher = _Watcher(os.urandom(8).hex(), os.path.normpath(path), recursive, entries)
        self._watchers[watcher.id] = watcher
        if not self._add_tree(watcher, watcher.root, ""):
            self.remove(watcher.id)
            raise HttpError(
                429, "too_many_watched_dirs", f"watching {path!r} would pass {MAX_DIRS} watched directories"
            )
        return watcher.id

    def _get(self, wid: str) -> _Watcher:
        watcher = self._watchers.get(wid)
        if watcher is None:
            raise HttpError(404, "not_found", f"watcher {wid!r} not found", {"field": "id"})
        return watcher

    async def take(self, wid: str, wait: float) -> list[WatchEvent]:
        """The watcher's queued events (waiting up to ``wait`` s for the first one); a lost watcher fails."""
        watcher = self._get(wid)
        if not watcher.events and watcher.lost is None and wait > 0:
            watcher.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watcher.changed.wait(), wait)
        if watcher.lost is not None:
            raise HttpError(409, "watcher_overflow", f"watcher {wid}: {watcher.lost}; events were lost")
        events = list(watcher.events)
        watcher.events.clear()
        return events

    def remove(self, wid: str) -> None:
        watcher = self._get(wid)
        del self._watchers[wid]
        for wd in list(watcher.wds):
            self._drop(watcher, wd)
        watcher.changed.set()

    def _drop(self, watcher: _Watcher, wd: int) -> None:
        """``watcher`` no longer holds ``wd``; the kernel's watch goes with its last holder."""
        watcher.wds.discard(wd)
        holders = self._holders.get(wd)
        if holders is None:
            return
        holders.pop(watcher.id, None)
        if not holders:
            del self._holders[wd]
            self._libc.inotify_rm_watch(self._fd, wd)

    def _release(self, watcher: _Watcher, rel: str) -> None:
        """Stop watching ``rel`` and what is under it for ``watcher`` (the subtree left the watched tree)."""
        for wd in list(watcher.wds):
            held = self._holders.get(wd, {}).get(watcher.id)
            if held is not None and (held == rel or held.startswith(rel + "/")):
                self._drop(watcher, wd)

    def _lose(self, watcher: _Watcher, reason: str) -> None:
        if watcher.lost is None:
            watcher.lost = reason
            watcher.events.clear()  # what stays queued would be a misleading partial picture
        watcher.changed.set()

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        offset = 0
        names = Names()  # owners named once per read, not per event
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, size = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size : offset + _HEADER.size + size].rstrip(b"\0")
            offset += _HEADER.size + size
            self._dispatch(wd, mask, os.fsdecode(name), names)

    def _dispatch(self, wd: int, mask: int, name: str, names: Names) -> None:
        if mask & _IN_Q_OVERFLOW:
            for every in self._watchers.values():
                self._lose(every, "the kernel's inotify queue overflowed")
            return
        if mask & _IN_IGNORED:  # the directory is gone: the kernel dropped its watch
            for wid in self._holders.pop(wd, {}):
                if (held := self._watchers.get(wid)) is not None:
                    held.wds.discard(wd)
            return
        kind = next((k for bits, k in _KINDS if mask & bits), None)
        if kind is None:
            return
        for wid, rel in list(self._holders.get(wd, {}).items()):
            watcher = self._watchers.get(wid)
            if watcher is None:
                continue
            if not name and rel == "":
                continue  # the watched directory itself (deleted or moved): envd reports entries, not the root
            relative = f"{rel}/{name}" if rel and name else (name or rel)
            if len(watcher.events) >= MAX_EVENTS:
                self._lose(watcher, f"more than {MAX_EVENTS} events were queued unfetched")
                continue
            if name:  # the *_SELF events of a subdirectory are reported by its parent already
                event: WatchEvent = {"type": kind, "name": relative}
                if watcher.entries and kind in _CARRY_ENTRY:
                    # Stat-ed as the event is read, as envd's watcher does; gone meanwhile: no entry (envd's too).
                    entry = _entry(os.path.join(watcher.root, relative), names)
                    if entry is not None:
                        event["entry"] = entry
                watcher.events.append(event)
                watcher.changed.set()
            if watcher.recursive and mask & _IN_ISDIR and mask & _IN_MOVED_FROM:
                self._release(watcher, relative)  # moved away: a move within the tree re-adds it (MOVED_TO)
            grew = watcher.recursive and mask & _IN_ISDIR and mask & (_IN_CREATE | _IN_MOVED_TO)
            if grew and not self._add_tree(watcher, os.path.join(watcher.root, relative), relative):
                self._lose(watcher, f"more than {MAX_DIRS} directories would be watched")


def _entry(path: str, names: Names) -> _Entry | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return {"path": path, **describe(os.path.basename(path), st, names, path)}


#: The longest one events request waits for a first event (a long-poll; the client polls again after it).
MAX_WAIT_SECONDS = 30.0


async def handle_watchers(watchers: Watchers, req: Request, resp: Response, rest: list[str]) -> None:
    """``POST /v1/watchers``, ``GET /v1/watchers/{id}/events?wait=s``, ``DELETE /v1/watchers/{id}``."""
    if not rest and req.method == "POST":
        body = await req.body.json()
        unknown = set(body) - {"path", "recursive", "user", "entries"}
        if unknown:
            raise invalid(sorted(unknown)[0], "unknown field")
        path = body.get("path")
        if body.get("user") is not None:
            # As the account: a relative path is in its home (which a first use of E2B's ``user`` creates).
            if not isinstance(path, str) or not path:
                raise invalid("path", "required")
            path = under_home(path, account(body["user"]))
        wid = watchers.create(path, body.get("recursive", False), body.get("entries", False))
        return await resp.send_json(201, {"id": wid})
    if len(rest) == 1 and req.method == "DELETE":
        watchers.remove(rest[0])
        return await resp.send(204)
    if len(rest) == 2 and rest[1] == "events" and req.method == "GET":
        try:
            wait = float(req.query.get("wait", "0"))
        except ValueError:
            raise invalid("wait", "must be a number of seconds") from None
        if not 0 <= wait <= MAX_WAIT_SECONDS:
            raise invalid("wait", f"must be 0-{MAX_WAIT_SECONDS:.0f} seconds")
        events = await watchers.take(rest[0], wait)
        return await resp.send_json(200, {"events": events})
    raise HttpError(404, "not_found", f"no route {req.method} {req.path}")
