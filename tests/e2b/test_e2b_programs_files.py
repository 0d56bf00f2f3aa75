"""Small programs of the kind in E2B's docs, run with the real ``e2b`` SDK (sync and async) against ``adx up``:
file calls whose answers differed from envd's (the error type of a list of a file or a write to a directory,
the events a watcher sees for ``files.write`` and when its stream ends, an upload naming a path twice, an empty
path, the type a download says)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import (
    AsyncSandbox,
    FilesystemEvent,
    FilesystemEventType,
    InvalidArgumentException,
    Sandbox,
    TimeoutException,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry

pytestmark = pytest.mark.slow


@pytest.fixture
def sandbox(adx_up: Up) -> Iterator[Sandbox]:
    made = Sandbox.create(**adx_up.opts())
    yield made
    made.kill()


def test_list_of_a_file_and_write_to_a_directory_are_invalid_arguments(sandbox: Sandbox) -> None:
    """envd answers both with its invalid-argument error (``path is not a directory``, ``path is a
    directory``): the SDK raises ``InvalidArgumentException``, not a bare ``SandboxException``."""
    sandbox.files.write("notes.txt", "x")
    with pytest.raises(InvalidArgumentException, match=r"(?i)not a directory"):
        sandbox.files.list("notes.txt")
    sandbox.files.make_dir("folder")
    with pytest.raises(InvalidArgumentException, match="is a directory"):
        sandbox.files.write("folder", "data")
    assert sandbox.files.get_info("folder").type.value == "dir"  # untouched


def test_write_files_refuses_one_path_twice(sandbox: Sandbox) -> None:
    """envd refuses an upload naming one path twice (400: the first file is written, the rest is not)."""
    entries: list[WriteEntry] = [
        WriteEntry(path="same.txt", data="first"),
        WriteEntry(path="/home/user/same.txt", data="second"),
        WriteEntry(path="other.txt", data="third"),
    ]
    with pytest.raises(InvalidArgumentException, match="twice"):
        sandbox.files.write_files(entries)
    assert sandbox.files.read("same.txt") == "first"
    assert not sandbox.files.exists("other.txt")


def test_an_empty_path_is_the_home(sandbox: Sandbox) -> None:
    """envd resolves an empty path as the user's home (the SDK sends it as given): ``list("")`` lists the home."""
    sandbox.files.write("here.txt", "x")
    assert [e.path for e in sandbox.files.list("")] == [e.path for e in sandbox.files.list("/home/user")]
    assert sandbox.files.get_info("").path == "/home/user"
    assert sandbox.files.get_info("", user="root").path == "/root"
    with pytest.raises(InvalidArgumentException):  # not 'remove the whole home'
        sandbox.files.remove("")
    assert sandbox.files.exists("here.txt")


def _names(events: list[FilesystemEvent]) -> set[str]:
    return {e.name for e in events}


def test_watching_a_write_sees_a_write_of_that_file_and_nothing_else(sandbox: Sandbox) -> None:
    """E2B's docs watch a directory, ``files.write`` into it and look for a ``WRITE`` event naming the file.
    ADX writes through a temporary file renamed into place (atomic); the watcher must not show that file, and must
    show the written file's creation and write."""
    sandbox.files.make_dir("watched")
    handle = sandbox.files.watch_dir("watched")
    sandbox.files.write("watched/my-file", "hello")
    sandbox.files.write("watched/my-file", "hello again")  # a rewrite is a write too
    deadline = time.monotonic() + 10
    events: list[FilesystemEvent] = []
    while time.monotonic() < deadline:
        events += handle.get_new_events()
        if sum(e.type is FilesystemEventType.WRITE for e in events) >= 2:
            break
        time.sleep(0.2)
    handle.stop()
    assert _names(events) == {"my-file"}, events
    kinds = [e.type for e in events]
    assert kinds.count(FilesystemEventType.WRITE) == 2, events
    assert kinds[0] is FilesystemEventType.CREATE and FilesystemEventType.WRITE in kinds[1:2], events


async def test_file_programs_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(**adx_up.opts())
    try:
        await sandbox.files.write("notes.txt", "x")
        with pytest.raises(InvalidArgumentException):
            await sandbox.files.list("notes.txt")
        await sandbox.files.make_dir("folder/sub")
        with pytest.raises(InvalidArgumentException):
            await sandbox.files.write("folder", "data")

        seen: list[FilesystemEvent] = []
        handle = await sandbox.files.watch_dir("folder", on_event=seen.append, recursive=True)
        await sandbox.files.write("folder/sub/deep.txt", "hello")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(e.type is FilesystemEventType.WRITE for e in seen):
            await sandbox.commands.run("sleep 0.2")
        await handle.stop()
        assert (FilesystemEventType.WRITE, "sub/deep.txt") in [(e.type, e.name) for e in seen], seen
        assert all("execd-tmp" not in e.name for e in seen), seen
    finally:
        await sandbox.kill()


async def test_an_async_watch_ends_at_its_timeout(adx_up: Up) -> None:
    """``watch_dir(timeout=...)`` bounds the stream (envd ends it with the call's deadline): events flow until then,
    and ``on_exit`` gets the SDK's ``TimeoutException``."""
    sandbox = await AsyncSandbox.create(**adx_up.opts())
    try:
        seen: list[FilesystemEvent] = []
        ended: asyncio.Queue[Exception | None] = asyncio.Queue()
        handle = await sandbox.files.watch_dir(".", on_event=seen.append, on_exit=ended.put_nowait, timeout=3)
        await sandbox.files.write("before.txt", "x")
        error = await asyncio.wait_for(ended.get(), 30)
        assert isinstance(error, TimeoutException), error
        assert "before.txt" in _names(seen)
        await handle.stop()
    finally:
        await sandbox.kill()


def test_a_download_url_says_the_files_type(sandbox: Sandbox) -> None:
    """envd serves a download with the type of the file's extension (a page opens as a page in a browser); the
    root's entry is named "/"."""
    sandbox.files.write("report.html", "<h1>hi</h1>")
    sandbox.files.write("data.json", "{}")
    sandbox.files.write("blob", b"\x00\x01")
    names = ("report.html", "data.json", "blob")
    kinds = {name: httpx.get(sandbox.download_url(name)).headers["content-type"] for name in names}
    assert kinds == {
        "report.html": "text/html; charset=utf-8",
        "data.json": "application/json",
        "blob": "application/octet-stream",
    }
    assert httpx.get(sandbox.download_url("report.html")).text == "<h1>hi</h1>"
    assert sandbox.files.get_info("/").name == "/"


def test_a_rewrite_keeps_the_files_mode_and_writes_through_a_symlink(sandbox: Sandbox) -> None:
    """envd writes a file in place: a script made executable stays so when rewritten, and a write to a symlink
    writes the file it points to (the link stays a link); a new file is 0644."""
    sandbox.files.write("run.sh", "#!/bin/sh\necho one\n")
    assert sandbox.files.get_info("run.sh").permissions == "-rw-r--r--"
    sandbox.commands.run("chmod 750 run.sh")
    sandbox.files.write("run.sh", "#!/bin/sh\necho two\n")
    assert sandbox.files.get_info("run.sh").permissions == "-rwxr-x---"
    assert sandbox.commands.run("./run.sh").stdout == "two\n"

    sandbox.commands.run("echo old > /tmp/target.txt && chmod 600 /tmp/target.txt && ln -s /tmp/target.txt link.txt")
    sandbox.files.write("link.txt", "through the link")
    assert sandbox.files.read("/tmp/target.txt") == "through the link"
    assert sandbox.files.get_info("link.txt").symlink_target == "/tmp/target.txt"
    assert sandbox.files.get_info("/tmp/target.txt").permissions == "-rw-------"
    sandbox.commands.run("ln -s /tmp/not-yet.txt dangling.txt")
    sandbox.files.write("dangling.txt", "made")  # a dangling link: its target is created
    assert sandbox.files.read("/tmp/not-yet.txt") == "made"


async def test_a_rewrite_keeps_the_files_mode_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(**adx_up.opts())
    try:
        await sandbox.files.write("run.sh", "#!/bin/sh\necho one\n")
        await sandbox.commands.run("chmod +x run.sh && ln -s run.sh again.sh")
        await sandbox.files.write("again.sh", "#!/bin/sh\necho two\n")
        assert (await sandbox.commands.run("./run.sh")).stdout == "two\n"
    finally:
        await sandbox.kill()
