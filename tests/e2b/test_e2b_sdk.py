"""The real ``e2b`` SDK against ``adx up``: sandboxes are ADX Environments of the key's tenant; commands and
files go through the Ingress, the Relay and execd."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import CommandExitException, Sandbox, SandboxQuery, SandboxState, TimeoutException
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException
from e2b.sandbox.filesystem.filesystem import FileType

import adx

pytestmark = pytest.mark.slow


@pytest.fixture
def sandbox(adx_up: Up) -> Iterator[Sandbox]:
    made = Sandbox.create(**adx_up.opts())
    yield made
    made.kill()


def test_create_is_an_adx_environment_and_kill_deletes_it(adx_up: Up) -> None:
    sandbox = Sandbox.create(metadata={"owner": "alice"}, envs={"GREETING": "hi"}, **adx_up.opts())
    environment = adx.Client(adx_up.url, adx_up.key).environments.get(sandbox.sandbox_id)
    assert environment.state == "running"
    assert environment.metadata == {"owner": "alice"}
    assert environment.lifecycle.lifetime_seconds == 300  # E2B's default timeout is the Environment's lifetime

    info = sandbox.get_info()
    assert (info.sandbox_id, info.template_id, info.state.value) == (sandbox.sandbox_id, "base", "running")
    assert info.metadata == {"owner": "alice"}
    assert 295 <= (info.end_at - info.started_at).total_seconds() <= 305
    assert sandbox.commands.run("echo $GREETING").stdout == "hi\n"
    listed = Sandbox.list(**adx_up.opts()).next_items()
    assert sandbox.sandbox_id in [s.sandbox_id for s in listed]
    only_alice = Sandbox.list(query=SandboxQuery(metadata={"owner": "alice"}), **adx_up.opts()).next_items()
    assert [s.sandbox_id for s in only_alice] == [sandbox.sandbox_id]
    assert sandbox.is_running()
    (metric,) = sandbox.get_metrics()  # the node's last usage sample (MET-1)
    assert metric.cpu_count == 1 and 0 <= metric.cpu_used_pct <= 100
    assert 0 < metric.mem_used < metric.mem_total and metric.mem_cache >= 0
    assert abs(metric.timestamp.timestamp() - time.time()) < 60

    assert sandbox.kill() is True
    assert not sandbox.is_running()
    assert Sandbox.kill(sandbox.sandbox_id, **adx_up.opts()) is False  # gone: E2B's "not found"
    assert sandbox.sandbox_id not in [s.sandbox_id for s in Sandbox.list(**adx_up.opts()).next_items()]
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, **adx_up.opts())


def test_commands_foreground_exit_codes_and_background(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo hello; echo oops >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "oops\n", 0)
    seen: list[str] = []
    sandbox.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=seen.append)
    assert "".join(seen) == "1\n2\n3\n"
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"

    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stdout == "partial\n"

    finished = sandbox.commands.run("sleep 0.2; echo done", background=True)
    assert finished.wait().stdout == "done\n"

    running = sandbox.commands.run("sleep 60", background=True)
    assert running.pid in [p.pid for p in sandbox.commands.list()]
    assert running.kill() is True
    with pytest.raises(CommandExitException) as killed:
        running.wait()
    assert killed.value.exit_code == -1  # killed by a signal, as envd reports it
    assert running.pid not in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(running.pid) is False


def test_command_stdin_and_deadline(sandbox: Sandbox) -> None:
    cat = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(cat.pid, "line one\n")
    sandbox.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "line one\n"
    streamed = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.stream_input(streamed.pid, [b"two ", "parts\n"])
    sandbox.commands.close_stdin(streamed.pid)
    assert streamed.wait().stdout == "two parts\n"

    # The call's deadline bounds the command itself (envd passes it on as the command's timeout).
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 10
    while any(p.args[-1:] == ["sleep 30"] for p in sandbox.commands.list()):
        assert time.monotonic() < deadline, "the timed-out command is still running"
        time.sleep(0.2)


def test_a_process_outlives_its_stream(sandbox: Sandbox) -> None:
    """envd's processes are not tied to the stream that started them: disconnect() leaves them running."""
    handle = sandbox.commands.run("sleep 1; echo survived > /tmp/outlived", background=True, timeout=0)
    handle.disconnect()
    assert sandbox.commands.connect(handle.pid).wait().exit_code == 0  # reattached: its end (not its output)
    deadline = time.monotonic() + 15
    while not sandbox.files.exists("/tmp/outlived"):
        assert time.monotonic() < deadline, "the command died with its stream"
        time.sleep(0.2)
    assert sandbox.files.read("/tmp/outlived") == "survived\n"


def test_files(sandbox: Sandbox) -> None:
    info = sandbox.files.write("/work/a.txt", "data")
    assert (info.name, info.path, info.type) == ("a.txt", "/work/a.txt", FileType.FILE)
    assert sandbox.files.read("/work/a.txt") == "data"
    payload = bytes(range(256)) * 1000
    sandbox.files.write("/work/deep/er/blob.bin", payload)  # parents made, like envd
    assert bytes(sandbox.files.read("/work/deep/er/blob.bin", format="bytes")) == payload
    sandbox.files.write("/work/streamed.bin", io.BytesIO(payload))  # octet-stream upload
    assert bytes(sandbox.files.read("/work/streamed.bin", format="bytes")) == payload
    sandbox.files.write("/work/zipped.bin", payload, gzip=True)  # gzip-encoded octet-stream upload
    assert bytes(sandbox.files.read("/work/zipped.bin", format="bytes", gzip=True)) == payload
    sandbox.files.write_files([{"path": "/work/m1", "data": "one"}, {"path": "/work/m2", "data": b"two"}])
    assert (sandbox.files.read("/work/m1"), sandbox.files.read("/work/m2")) == ("one", "two")
    sandbox.files.write("relative.txt", "home")  # relative paths: the home directory
    assert sandbox.commands.run("cat ~/relative.txt").stdout == "home"

    entries = {e.name: e for e in sandbox.files.list("/work")}
    assert {"a.txt", "deep", "streamed.bin", "m1", "m2"} <= set(entries)
    assert entries["a.txt"].size == 4 and entries["a.txt"].type == FileType.FILE
    assert entries["deep"].type == FileType.DIR
    assert "/work/deep/er/blob.bin" in [e.path for e in sandbox.files.list("/work/deep", depth=3)]

    assert sandbox.files.exists("/work/a.txt")
    assert not sandbox.files.exists("/work/missing")
    assert sandbox.files.make_dir("/work/x/y") is True
    assert sandbox.files.make_dir("/work/x/y") is False  # already there
    assert sandbox.files.get_info("/work/x/y").type == FileType.DIR
    sandbox.files.rename("/work/a.txt", "/work/x/b.txt")
    assert sandbox.files.read("/work/x/b.txt") == "data"
    sandbox.files.remove("/work/x")
    assert not sandbox.files.exists("/work/x/b.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.read("/work/missing")


@pytest.mark.req("SEC-2")
def test_another_tenant_can_neither_see_nor_touch_a_sandbox(adx_up: Up, sandbox: Sandbox) -> None:
    other = adx_up.opts(adx_up.other_key)
    assert sandbox.sandbox_id not in [s.sandbox_id for s in Sandbox.list(**other).next_items()]
    with pytest.raises(NotFoundException) as foreign:
        Sandbox.get_info(sandbox.sandbox_id, **other)
    with pytest.raises(NotFoundException) as missing:
        Sandbox.get_info("env-" + "a" * 26, **other)
    assert str(foreign.value).replace(sandbox.sandbox_id, "ID") == str(missing.value).replace("env-" + "a" * 26, "ID")
    assert Sandbox.kill(sandbox.sandbox_id, **other) is False
    with pytest.raises(SandboxException):
        Sandbox.connect(sandbox.sandbox_id, **other)
    with pytest.raises(SandboxException):
        Sandbox.set_timeout(sandbox.sandbox_id, 60, **other)
    # The other tenant's own sandbox token opens only that sandbox.
    own = Sandbox.create(**other)
    try:
        assert own.commands.run("echo mine").stdout == "mine\n"
        intruder = Sandbox(
            sandbox_id=sandbox.sandbox_id,
            envd_version=own._envd_version,
            envd_access_token=own._envd_access_token,
            sandbox_domain=None,
            connection_config=_config(adx_up, adx_up.other_key, sandbox.sandbox_id, own._envd_access_token),
        )
        with pytest.raises(AuthenticationException):
            intruder.commands.run("echo stolen")
        with pytest.raises(AuthenticationException):
            intruder.files.read("/etc/hostname")
    finally:
        own.kill()
    assert sandbox.is_running()  # untouched


@pytest.mark.req("SEC-4")
def test_a_wrong_access_token_is_refused(adx_up: Up, sandbox: Sandbox) -> None:
    token = sandbox._envd_access_token
    assert token
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for bad in (forged, "", "e2b1.x.y"):
        impostor = Sandbox(
            sandbox_id=sandbox.sandbox_id,
            envd_version=sandbox._envd_version,
            envd_access_token=bad,
            sandbox_domain=None,
            connection_config=_config(adx_up, adx_up.key, sandbox.sandbox_id, bad),
        )
        with pytest.raises(AuthenticationException):
            impostor.commands.run("touch /tmp/forged")
        with pytest.raises(AuthenticationException):
            impostor.files.write("/tmp/forged", "x")
    assert not sandbox.files.exists("/tmp/forged")


def _config(up: Up, key: str, sandbox_id: str, token: str | None) -> object:
    from e2b import ConnectionConfig

    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
    if token:
        headers["X-Access-Token"] = token
    return ConnectionConfig(api_key=key, api_url=up.url, sandbox_url=up.url, extra_sandbox_headers=headers)


def test_set_timeout_moves_the_deadline(adx_up: Up, sandbox: Sandbox) -> None:
    sandbox.set_timeout(1200)
    left = (sandbox.get_info().end_at - datetime.now(UTC)).total_seconds()
    assert 1190 <= left <= 1201
    sandbox.set_timeout(60)  # shorter works too: the deadline is absolute, reset by each call
    assert 50 <= (sandbox.get_info().end_at - datetime.now(UTC)).total_seconds() <= 61


def test_the_timeout_ends_the_sandbox(adx_up: Up) -> None:
    sandbox = Sandbox.create(timeout=2, **adx_up.opts())
    deadline = time.monotonic() + 30
    while sandbox.is_running():
        assert time.monotonic() < deadline, "still running well past its timeout"
        time.sleep(0.5)
    with pytest.raises(NotFoundException):
        sandbox.get_info()


def test_pause_then_traffic_or_connect_resumes_with_files(adx_up: Up, sandbox: Sandbox) -> None:
    sandbox.files.write("/work/kept.txt", "kept")
    assert sandbox.pause() is True
    assert sandbox.get_info().state.value == "paused"
    assert sandbox.pause() is False  # already paused: E2B's 409
    assert sandbox.get_metrics() == []  # asking for usage does not wake it
    assert sandbox.get_info().state.value == "paused"
    # Data-plane traffic wakes it (the Ingress's EnsureRunning), like any /v1 data-plane call.
    assert sandbox.files.read("/work/kept.txt") == "kept"
    assert sandbox.get_info().state.value == "running"
    sandbox.files.write("/work/second.txt", "second")
    assert sandbox.pause() is True
    resumed = Sandbox.connect(sandbox.sandbox_id, **adx_up.opts())
    assert resumed.get_info().state.value == "running"
    assert (resumed.files.read("/work/kept.txt"), resumed.files.read("/work/second.txt")) == ("kept", "second")
    assert resumed.commands.run("cat /work/second.txt").stdout == "second"


def test_pause_and_connect_three_times_lose_nothing(adx_up: Up, sandbox: Sandbox) -> None:
    for cycle in range(3):
        sandbox.files.write(f"/work/cycle-{cycle}.txt", f"cycle {cycle}")
        assert sandbox.pause() is True
        assert sandbox.get_info().state.value == "paused"
        assert sandbox.pause() is False  # already paused: E2B's 409
        assert sandbox.sandbox_id in [
            s.sandbox_id
            for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED]), **adx_up.opts()).next_items()
        ]
        resumed = Sandbox.connect(sandbox.sandbox_id, **adx_up.opts())
        assert resumed.get_info().state.value == "running"
        for earlier in range(cycle + 1):
            assert resumed.files.read(f"/work/cycle-{earlier}.txt") == f"cycle {earlier}"
        assert resumed.commands.run("echo back").stdout == "back\n"
        sandbox = resumed
    assert Sandbox.connect(sandbox.sandbox_id, **adx_up.opts()).sandbox_id == sandbox.sandbox_id  # running: as is
