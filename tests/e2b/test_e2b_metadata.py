"""File metadata through the real ``e2b`` SDK against ``adx up``: ``files.write(..., metadata=)`` stores it as
the file's ``user.e2b.*`` extended attributes (as envd), and ``get_info``/``list`` read it back, also when set
out-of-band inside the sandbox."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from e2b import AsyncSandbox, Sandbox

if TYPE_CHECKING:
    from conftest import Up

pytestmark = pytest.mark.slow


def test_metadata_written_is_read_back(adx_up: Up) -> None:
    sandbox = Sandbox.create(**adx_up.opts())
    try:
        info = sandbox.files.write("/home/user/m.txt", "data", metadata={"Owner": "alice", "stage": "raw"})
        assert info.metadata == {"owner": "alice", "stage": "raw"}  # keys lowercased, as envd
        assert sandbox.files.get_info("/home/user/m.txt").metadata == {"owner": "alice", "stage": "raw"}
        listed = {e.name: e.metadata for e in sandbox.files.list("/home/user")}
        assert listed["m.txt"] == {"owner": "alice", "stage": "raw"}
        # The same metadata on every file of a multi-file upload; none where none was given.
        sandbox.files.write_files(
            [{"path": "/home/user/a.txt", "data": "a"}, {"path": "/home/user/b.txt", "data": "b"}], metadata={"k": "v"}
        )
        assert sandbox.files.get_info("/home/user/b.txt").metadata == {"k": "v"}
        sandbox.files.write("/home/user/plain.txt", "x")
        assert sandbox.files.get_info("/home/user/plain.txt").metadata is None
        # They are real extended attributes in the sandbox: seen there, and set there they are read back.
        seen = sandbox.commands.run(
            "python3 -c \"import os; print(os.getxattr('/home/user/m.txt', 'user.e2b.owner').decode())\""
        )
        assert seen.stdout.strip() == "alice"
        sandbox.commands.run("python3 -c \"import os; os.setxattr('/home/user/plain.txt', 'user.e2b.by', b'hand')\"")
        assert sandbox.files.get_info("/home/user/plain.txt").metadata == {"by": "hand"}
        # A rewrite keeps the file's metadata, as envd's write in place does; new keys are added, given ones set.
        sandbox.files.write("/home/user/m.txt", "new")
        assert sandbox.files.get_info("/home/user/m.txt").metadata == {"owner": "alice", "stage": "raw"}
        sandbox.files.write("/home/user/m.txt", "newer", metadata={"stage": "done", "by": "bob"})
        assert sandbox.files.get_info("/home/user/m.txt").metadata == {"owner": "alice", "stage": "done", "by": "bob"}
        assert sandbox.files.read("/home/user/m.txt") == "newer"
    finally:
        sandbox.kill()


async def test_metadata_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(**adx_up.opts())
    try:
        info = await sandbox.files.write("m.txt", b"data", metadata={"a": "1"})
        assert info.metadata == {"a": "1"}
        assert (await sandbox.files.get_info("m.txt")).metadata == {"a": "1"}
    finally:
        await sandbox.kill()
