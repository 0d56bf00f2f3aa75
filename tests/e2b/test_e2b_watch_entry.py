"""``files.watch_dir(..., include_entry=True)`` with the real ``e2b`` SDK (sync polling and the async stream)
against ``adx up``: as envd's watcher, a ``create``, ``write`` or ``chmod`` event carries the ``EntryInfo`` of
what the path holds when the event is read (stat-ed then, in the sandbox), a ``remove`` or ``rename`` none (the
path no longer names that entry), nor does any event of a watch without ``include_entry``."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest
from e2b import AsyncSandbox, FilesystemEvent, FileType, Sandbox

if TYPE_CHECKING:
    from conftest import Up

pytestmark = pytest.mark.slow


def _until(fetch: object, wanted: set[tuple[str, str]], within: float = 20.0) -> list[FilesystemEvent]:
    """Events fetched until every (type, name) in ``wanted`` has been seen."""
    events: list[FilesystemEvent] = []
    deadline = time.monotonic() + within
    while not wanted <= {(e.type.value, e.name) for e in events}:
        assert time.monotonic() < deadline, [(e.type.value, e.name) for e in events]
        events.extend(fetch())  # type: ignore[operator]
        time.sleep(0.1)
    return events


def _of(events: list[FilesystemEvent], kind: str, name: str) -> list[FilesystemEvent]:
    return [e for e in events if (e.type.value, e.name) == (kind, name)]


def test_events_carry_the_entry_when_asked(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/tmp/we")
    handle = sandbox.files.watch_dir("/tmp/we", include_entry=True)
    plain = sandbox.files.watch_dir("/tmp/we")
    try:
        sandbox.files.write("/tmp/we/a.txt", "hello")
        events = _until(handle.get_new_events, {("create", "a.txt"), ("write", "a.txt")})
        for event in _of(events, "create", "a.txt") + _of(events, "write", "a.txt"):
            entry = event.entry
            assert entry is not None
            assert (entry.name, entry.type, entry.path, entry.size) == ("a.txt", FileType.FILE, "/tmp/we/a.txt", 5)
            assert (entry.owner, entry.group, entry.permissions, entry.mode) == ("user", "user", "-rw-r--r--", 0o644)
        sandbox.commands.run("mkdir /tmp/we/d && chmod 600 /tmp/we/a.txt")
        events = _until(handle.get_new_events, {("create", "d"), ("chmod", "a.txt")})
        (made,) = _of(events, "create", "d")
        assert made.entry is not None and (made.entry.type, made.entry.path) == (FileType.DIR, "/tmp/we/d")
        (changed,) = _of(events, "chmod", "a.txt")
        assert changed.entry is not None and changed.entry.permissions == "-rw-------"
        sandbox.commands.run("mv /tmp/we/d /tmp/d-away && rm /tmp/we/a.txt")
        events = _until(handle.get_new_events, {("rename", "d"), ("remove", "a.txt")})
        assert [e.entry for e in _of(events, "rename", "d") + _of(events, "remove", "a.txt")] == [None, None]
        unasked = _until(plain.get_new_events, {("create", "a.txt"), ("chmod", "a.txt"), ("remove", "a.txt")})
        assert all(e.entry is None for e in unasked)
    finally:
        handle.stop()
        plain.stop()


async def test_the_async_stream_carries_entries(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(**adx_up.opts())
    try:
        await sandbox.files.make_dir("/tmp/we")
        events: list[FilesystemEvent] = []
        handle = await sandbox.files.watch_dir("/tmp/we", on_event=events.append, include_entry=True)
        await sandbox.files.write("/tmp/we/b.txt", "four")
        deadline = time.monotonic() + 20
        while not _of(events, "write", "b.txt"):
            assert time.monotonic() < deadline, events
            await asyncio.sleep(0.1)
        (written,) = _of(events, "write", "b.txt")
        assert written.entry is not None
        assert (written.entry.path, written.entry.size, written.entry.owner) == ("/tmp/we/b.txt", 4, "user")
        await handle.stop()
    finally:
        await sandbox.kill()
