"""The real ``e2b`` SDK's directory watch (inotify in the sandbox's execd) and PTYs against ``adx up``.

The sync SDK watches by polling (``CreateWatcher`` / ``GetWatcherEvents`` / ``RemoveWatcher``), the async SDK by
the ``WatchDir`` stream; both are driven here.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FilesystemEvent,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    Sandbox,
)
from e2b.exceptions import RateLimitException, SandboxException

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


def test_watch_dir_recursive_follows_subdirectories_moved_within_and_out(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/tmp/w/sub/deeper")
    handle = sandbox.files.watch_dir("/tmp/w", recursive=True)
    events: list[FilesystemEvent] = []

    def seen_event(event: tuple[str, str]) -> Callable[[], bool]:
        def check() -> bool:
            events.extend(handle.get_new_events())
            return event in _seen(events)

        return check

    sandbox.commands.run("mv /tmp/w/sub /tmp/w/moved")
    # The moved-in directory is watched once its event is read (inotify has no recursive watch: a file created
    # in it before that moment is not seen, as with envd's watcher).
    _until(seen_event(("create", "moved")))
    sandbox.commands.run(
        "echo a > /tmp/w/moved/deeper/in.txt && mv /tmp/w/moved /tmp/gone && echo b > /tmp/gone/deeper/out.txt"
        " && echo c > /tmp/w/last.txt"
    )
    _until(seen_event(("create", "last.txt")))
    seen = _seen(events)
    assert {("rename", "sub"), ("create", "moved"), ("create", "moved/deeper/in.txt"), ("rename", "moved")} <= seen
    assert not any("out.txt" in name for _, name in seen), seen  # moved out of the tree: no longer watched
    handle.stop()


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


class _Output:
    """What a handle's stream delivered, read on its own thread (the sync SDK's wait() blocks)."""

    def __init__(self, wait: Callable[..., object], key: str) -> None:
        self.data = bytearray()
        self.ended: BaseException | bool | None = False
        self._thread = threading.Thread(target=self._run, args=(wait, key), daemon=True)
        self._thread.start()

    def _run(self, wait: Callable[..., object], key: str) -> None:
        def add(chunk: bytes | str) -> None:
            self.data += chunk if isinstance(chunk, bytes) else chunk.encode()

        try:
            wait(**{key: add})
            self.ended = None
        except BaseException as exc:  # a killed command ends with CommandExitException: recorded, not lost
            self.ended = exc

    def saw(self, text: str) -> bool:
        return text.encode() in self.data

    def join(self, seconds: float) -> None:
        self._thread.join(seconds)
        assert not self._thread.is_alive(), "the stream did not end"


def test_pty_sync_create_input_resize_reconnect_kill(sandbox: Sandbox) -> None:
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), cwd="/tmp", envs={"GREETING": "hi-there"})
    first = _Output(handle.wait, "on_pty")
    sandbox.pty.send_stdin(handle.pid, b"tty; echo $GREETING; pwd; stty size\n")
    _until(lambda: first.saw("hi-there\r\n") and first.saw("24 80\r\n") and first.saw("/tmp\r\n"))
    assert first.saw("/dev/pts/")  # a real pseudo-terminal
    sandbox.pty.stream_input(handle.pid, [b"echo streamed-", b"$((1+1))\n"])
    _until(lambda: first.saw("streamed-2\r\n"))
    sandbox.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(handle.pid, b"stty size\n")
    _until(lambda: first.saw("30 100\r\n"))
    # The shell is a session leader with the PTY as controlling terminal: its own job control works.
    sandbox.pty.send_stdin(handle.pid, b"echo ctl-$(cut -d' ' -f6,7 /proc/$$/stat)-$$-end\n")
    _until(lambda: re.search(rb"ctl-(\d+) (\d+)-(\d+)-end", first.data) is not None)
    found = re.search(rb"ctl-(\d+) (\d+)-(\d+)-end", first.data)
    assert found is not None
    session, tty_nr, shell = (int(x) for x in found.groups())
    assert session == shell and tty_nr != 0, found.group(0)
    assert not first.saw("no job control")

    second = _Output(sandbox.pty.connect(handle.pid).wait, "on_pty")
    sandbox.pty.send_stdin(handle.pid, b"echo again-$((40+2))\n")
    _until(lambda: second.saw("again-42") and first.saw("again-42"))
    assert not second.saw("hi-there")  # no replay: output from the reconnect on

    assert sandbox.pty.kill(handle.pid) is True
    first.join(10)
    second.join(10)
    assert first.ended is not None and second.ended is not None  # killed: both streams end with the exit
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]
    assert sandbox.pty.kill(handle.pid) is False


def test_commands_connect_streams_live_output(sandbox: Sandbox) -> None:
    command = sandbox.commands.run("for i in $(seq 1 200); do echo tick-$i; sleep 0.1; done", background=True)
    time.sleep(0.5)
    follower = _Output(sandbox.commands.connect(command.pid).wait, "on_stdout")
    _until(lambda: follower.saw("tick-"))
    seen = follower.data.count(b"tick-")
    _until(lambda: follower.data.count(b"tick-") >= seen + 5)  # it keeps streaming, live
    command.kill()
    follower.join(10)


def test_pty_async_create_resize_reconnect_kill(adx_up: Up) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(**adx_up.opts())
        try:
            first, second = bytearray(), bytearray()

            async def until(check: Callable[[], bool]) -> None:
                deadline = time.monotonic() + 10
                while not check():
                    assert time.monotonic() < deadline, (bytes(first), bytes(second))
                    await asyncio.sleep(0.1)

            handle = await sandbox.pty.create(PtySize(rows=24, cols=80), on_data=first.extend)
            await sandbox.pty.send_stdin(handle.pid, b"echo hi\n")
            await until(lambda: b"hi\r\n" in first)
            await sandbox.pty.resize(handle.pid, PtySize(rows=40, cols=120))
            await sandbox.pty.send_stdin(handle.pid, b"stty size\n")
            await until(lambda: b"40 120\r\n" in first)
            again = await sandbox.pty.connect(handle.pid, on_data=second.extend)
            await sandbox.pty.send_stdin(handle.pid, b"echo more-$((6*7))\n")
            await until(lambda: b"more-42" in second)
            assert await sandbox.pty.kill(handle.pid) is True
            for each in (handle, again):
                with pytest.raises(CommandExitException):
                    await asyncio.wait_for(each.wait(), 10)
        finally:
            await sandbox.kill()

    asyncio.run(main())


def test_watch_bounds_are_clear_errors(sandbox: Sandbox) -> None:
    """128 watchers per sandbox, 16384 unfetched events per watcher: past either, an error that says so."""
    sandbox.files.make_dir("/tmp/many")
    handles = [sandbox.files.watch_dir("/tmp/many") for _ in range(128)]
    with pytest.raises(RateLimitException, match="128 watchers"):
        sandbox.files.watch_dir("/tmp/many")
    for handle in handles[1:]:
        handle.stop()
    flooded = handles[0]
    sandbox.commands.run("cd /tmp/many && for i in $(seq 1 17000); do : > f$i; done", timeout=120)
    with pytest.raises(SandboxException, match="events were lost"):
        flooded.get_new_events()
    flooded.stop()
    fresh = sandbox.files.watch_dir("/tmp/many")  # the bounds are per live watcher: a new one works
    sandbox.files.write("/tmp/many/late.txt", "x")
    events: list[FilesystemEvent] = []

    def late() -> bool:
        events.extend(fresh.get_new_events())
        return ("create", "late.txt") in _seen(events)

    _until(late)


def test_an_ended_watch_stream_leaves_no_watcher_behind(adx_up: Up) -> None:
    """More WatchDir streams opened and stopped than a sandbox may hold watchers: each stream's watcher went."""

    async def main() -> None:
        sandbox = await AsyncSandbox.create(**adx_up.opts())
        try:
            await sandbox.files.make_dir("/tmp/w")
            for _ in range(140):
                handle = await sandbox.files.watch_dir("/tmp/w", on_event=lambda e: None)
                await handle.stop()
            deadline = time.monotonic() + 10
            kept = []
            while len(kept) < 100:  # the removals run as the server notices each stream's end
                try:
                    kept.append(await sandbox.files.watch_dir("/tmp/w", on_event=lambda e: None))
                except RateLimitException:
                    assert time.monotonic() < deadline, "watchers of ended streams were not removed"
                    await asyncio.sleep(0.5)
            for handle in kept:
                await handle.stop()
        finally:
            await sandbox.kill()

    asyncio.run(main())
