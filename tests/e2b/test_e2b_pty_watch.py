"""The real ``e2b`` SDK's directory watch (inotify in the sandbox's execd) and PTYs against ``adx up``.

The sync SDK watches by polling (``CreateWatcher`` / ``GetWatcherEvents`` / ``RemoveWatcher``), the async SDK by
the ``WatchDir`` stream; both are driven here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import AsyncSandbox, FilesystemEvent, FilesystemEventType, NotFoundException, Sandbox
from e2b.exceptions import SandboxException

pytestmark = pytest.mark.slow

_CHANGES = (
    "mkdir -p /tmp/w && echo one > /tmp/w/a.txt && echo two >> /tmp/w/a.txt && mv /tmp/w/a.txt /tmp/w/b.txt"
    " && chmod 600 /tmp/w/b.txt && mkdir /tmp/w/sub && sleep 0.3 && echo deep > /tmp/w/sub/c.txt && rm /tmp/w/b.txt"
)


@pytest.fixture
def sandbox(adx_up: Up) -> Iterator[Sandbox]:
    made = Sandbox.create(**adx_up.opts())
    yield made
    made.kill()


def _seen(events: list[FilesystemEvent]) -> set[tuple[str, str]]:
    return {(e.type.value, e.name) for e in events}


_EXPECTED = {
    ("create", "a.txt"),
    ("write", "a.txt"),
    ("rename", "a.txt"),
    ("create", "b.txt"),
    ("chmod", "b.txt"),
    ("create", "sub"),
    ("create", "sub/c.txt"),
    ("write", "sub/c.txt"),
    ("remove", "b.txt"),
}


def _until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_watch_dir_sync_recursive_events_and_stop(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/tmp/w")
    handle = sandbox.files.watch_dir("/tmp/w", recursive=True)
    sandbox.commands.run(_CHANGES)
    events: list[FilesystemEvent] = []

    def everything() -> bool:
        events.extend(handle.get_new_events())
        return _seen(events) >= _EXPECTED

    _until(everything)
    assert all(e.type in set(FilesystemEventType) for e in events)
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()  # stopped: the SDK refuses before asking


def test_watch_dir_not_recursive_sees_only_its_own_entries(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/tmp/w/sub")
    handle = sandbox.files.watch_dir("/tmp/w")
    sandbox.files.write("/tmp/w/sub/inner.txt", "x")
    sandbox.files.write("/tmp/w/top.txt", "x")
    events: list[FilesystemEvent] = []

    def top() -> bool:
        events.extend(handle.get_new_events())
        return ("create", "top.txt") in _seen(events)

    _until(top)
    assert not any(e.name.startswith("sub/") for e in events), events
    handle.stop()


def test_watch_dir_missing_path_is_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sandbox.files.watch_dir("/tmp/no-such-dir")


def test_watch_dir_async_stream_and_stop(adx_up: Up) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(**adx_up.opts())
        try:
            with pytest.raises(NotFoundException):
                await sandbox.files.watch_dir("/tmp/no-such-dir", on_event=lambda e: None)
            await sandbox.files.make_dir("/tmp/w")
            events: list[FilesystemEvent] = []
            handle = await sandbox.files.watch_dir("/tmp/w", on_event=events.append, recursive=True)
            await sandbox.commands.run(_CHANGES)
            deadline = time.monotonic() + 10
            while not _seen(events) >= _EXPECTED:
                assert time.monotonic() < deadline, _seen(events)
                await asyncio.sleep(0.1)
            await handle.stop()
            count = len(events)
            await sandbox.files.write("/tmp/w/after.txt", "x")
            await asyncio.sleep(1.0)
            assert len(events) == count  # stopped: nothing more arrives
        finally:
            await sandbox.kill()

    asyncio.run(main())
