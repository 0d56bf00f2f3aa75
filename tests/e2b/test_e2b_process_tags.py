"""envd's process tags, driven through the real ``e2b`` SDK's own envd client against ``adx up``: a ``Start`` with a
``tag`` (as envd's start command is tagged) is listed with it (``commands.list()``'s ``tag``), and a
``ProcessSelector`` by tag reaches it (``SendSignal``, ``Connect``); a tag no running process has is envd's
``not_found``. The SDK's high-level calls start untagged processes (``tag`` None in the list)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
from e2b import NotFoundException, Sandbox
from e2b.envd.process import process_pb
from e2b.envd.utils import authentication_header, extract_start_pid
from protobuf import Oneof

if TYPE_CHECKING:
    from conftest import Up

pytestmark = pytest.mark.slow


def _start_tagged(sandbox: Sandbox, tag: str, command: str) -> int:
    """A Start with ``tag``, as envd's own callers send it; its PID (the stream is read up to its start event)."""
    commands = sandbox.commands
    stream = commands._rpc.start(
        process_pb.StartRequest(
            process=process_pb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", command]),
            tag=tag,
        ),
        headers=authentication_header(commands._envd_version, None),
        timeout_ms=60_000,
    )
    return extract_start_pid(next(iter(stream)), "start a tagged process")


def test_a_tagged_process_is_listed_and_selected_by_its_tag(adx_up: Up, sandbox: Sandbox) -> None:
    untagged = sandbox.commands.run("sleep 600", background=True)
    pid = _start_tagged(sandbox, "startCmd", "sleep 600")
    listed = {p.pid: p.tag for p in sandbox.commands.list()}
    assert listed[pid] == "startCmd" and listed[untagged.pid] is None

    # Connect by tag: the process's start event names its PID.
    rpc, headers = sandbox.commands._rpc, authentication_header(sandbox.commands._envd_version, None)
    connected = rpc.connect(
        process_pb.ConnectRequest(process=process_pb.ProcessSelector(selector=Oneof("tag", "startCmd"))),
        headers=headers,
        timeout_ms=5_000,
    )
    assert extract_start_pid(next(iter(connected)), "connect by tag") == pid

    # SendSignal by tag ends it; then the tag names no process: envd's not_found.
    rpc.send_signal(
        process_pb.SendSignalRequest(
            process=process_pb.ProcessSelector(selector=Oneof("tag", "startCmd")), signal=process_pb.Signal.SIGKILL
        ),
        headers=headers,
    )
    deadline = time.monotonic() + 10
    while pid in {p.pid for p in sandbox.commands.list()}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(Exception, match="not found") as missing:
        rpc.send_signal(
            process_pb.SendSignalRequest(
                process=process_pb.ProcessSelector(selector=Oneof("tag", "startCmd")), signal=process_pb.Signal.SIGKILL
            ),
            headers=headers,
        )
    assert "startCmd" in str(missing.value)
    untagged.kill()
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999_999)
