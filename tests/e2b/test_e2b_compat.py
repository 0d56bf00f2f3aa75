"""E2B behaviours ADX once answered differently (issue 14's "Found" list), driven through the real ``e2b`` SDK
against ``adx up``: the error body of unserved routes, ``set_timeout(0)``, filesystem edge cases, the list
order and filters, the command deadline and a killed sandbox."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import AsyncSandbox, AsyncTemplate, Sandbox, SandboxQuery, Template, TimeoutException
from e2b.exceptions import NotFoundException, SandboxException, SandboxNotRunningException
from e2b.sandbox.filesystem.filesystem import FileType

pytestmark = pytest.mark.slow


@pytest.fixture
def sandbox(adx_up: Up) -> Iterator[Sandbox]:
    made = Sandbox.create(**adx_up.opts())
    yield made
    made.kill()


def _sandbox_with_headers(adx_up: Up, sandbox: Sandbox, extra: dict[str, str]) -> Sandbox:
    from e2b import ConnectionConfig

    token = sandbox._envd_access_token
    assert token
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token, **extra}
    config = ConnectionConfig(
        api_key=adx_up.key, api_url=adx_up.url, sandbox_url=adx_up.url, extra_sandbox_headers=headers
    )
    return Sandbox(
        sandbox_id=sandbox.sandbox_id,
        envd_version=sandbox._envd_version,
        envd_access_token=token,
        sandbox_domain=None,
        connection_config=config,
    )


# 1. Error body ---------------------------------------------------------------------------------------------


def test_routes_not_served_answer_e2b_errors_the_sdk_raises_cleanly(adx_up: Up, sandbox: Sandbox) -> None:
    """Any path not served answers ``{"code", "message"}``: the SDK raises its own exception (it used to crash with
    ``KeyError: 'code'`` on ADX's error shape), as it does for a served route's error (a missing template's tags).
    (Snapshots, volumes, template builds, tags and listing are served: test_e2b_snapshots.py, test_e2b_volumes.py,
    test_e2b_templates.py, test_e2b_template_tags.py.)"""
    with pytest.raises(SandboxException) as missing:
        Template.get_tags("some-template", **adx_up.opts())
    assert "not found" in str(missing.value)

    headers = {"X-API-KEY": adx_up.key}
    for method, path in [
        ("GET", "/default-templates"),
        ("GET", "/templates/some-template/builds"),
        ("GET", "/volumes/vol-aaaaaaaaaaaaaaaaaaaaaaaaaa/extra"),
        ("GET", "/snapshots/snap-aaaaaaaaaaaaaaaaaaaaaaaaaa"),
        ("POST", f"/sandboxes/{sandbox.sandbox_id}/refreshes"),  # (network is served: test_e2b_network.py)
        ("GET", f"/sandboxes/{sandbox.sandbox_id}/timeout"),  # a served path, another method
        ("GET", "/v2/sandboxes/nothing/here"),
        ("GET", "/sandboxes"),
    ]:
        answer = httpx.request(method, adx_up.url + path, headers=headers)
        body = answer.json()
        assert answer.status_code == 501, (method, path, answer.status_code)
        assert body["code"] == answer.status_code and isinstance(body["message"], str) and body["message"], body

    # envd: an unknown path or RPC on the data plane
    token = sandbox._envd_access_token
    assert token
    envd = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
    for method, path in [("GET", "/nowhere"), ("POST", "/files/extra"), ("DELETE", "/files"), ("GET", "/health/x")]:
        answer = httpx.request(method, adx_up.url + path, headers=envd)
        body = answer.json()
        assert answer.status_code >= 400 and body["code"] == answer.status_code, (path, body)
        assert isinstance(body["message"], str) and body["message"]


def test_an_unexpected_failure_is_still_an_e2b_error(adx_up: Up) -> None:
    """A malformed JSON body on a served route: E2B's shape with status 400, the SDK's InvalidArgument."""
    answer = httpx.post(
        adx_up.url + "/v2/sandboxes",
        headers={"X-API-KEY": adx_up.key, "content-type": "application/json"},
        content=b"{",
    )
    assert answer.status_code == 400 and answer.json()["code"] == 400


def test_route_errors_async(adx_up: Up) -> None:
    async def main() -> None:
        with pytest.raises(SandboxException) as missing:
            await AsyncTemplate.get_tags("some-template", **adx_up.opts())
        assert "not found" in str(missing.value)

    asyncio.run(main())


# 2. set_timeout(0) ----------------------------------------------------------------------------------------


def test_set_timeout_zero_ends_the_sandbox_now(adx_up: Up) -> None:
    """E2B: the timeout is counted from now, so 0 expires the sandbox at once (killed; paused with autoPause)."""
    sandbox = Sandbox.create(**adx_up.opts())
    sandbox.set_timeout(0)
    deadline = time.monotonic() + 30
    while sandbox.is_running():
        assert time.monotonic() < deadline, "still running after set_timeout(0)"
        time.sleep(0.2)
    with pytest.raises(NotFoundException):
        sandbox.get_info()

    paused = Sandbox.create(lifecycle={"on_timeout": "pause"}, **adx_up.opts())
    try:
        with pytest.raises(SandboxException, match="timeout: must be an integer >= 0"):
            paused.set_timeout(-1)
        Sandbox.set_timeout(paused.sandbox_id, 0, **adx_up.opts())
        deadline = time.monotonic() + 60
        while paused.get_info().state.value != "paused":
            assert time.monotonic() < deadline, "an autoPause sandbox was not paused by set_timeout(0)"
            time.sleep(0.3)
    finally:
        paused.kill()


def test_set_timeout_zero_async(adx_up: Up) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(**adx_up.opts())
        await sandbox.set_timeout(0)
        deadline = time.monotonic() + 30
        while await sandbox.is_running():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)

    asyncio.run(main())


# 3. Filesystem ----------------------------------------------------------------------------------------------


def test_remove_missing_is_a_noop_symlinks_and_proc_files(sandbox: Sandbox) -> None:
    sandbox.files.remove("/home/user/never-existed")  # envd: no error
    sandbox.files.remove("/home/user/never/existed/either")

    sandbox.files.write("/home/user/target.txt", "pointed at")
    # Made by the commands' user (E2B's ``user``) in its home, where it may write.
    sandbox.commands.run("ln -s ~/target.txt ~/link && ln -s ~ ~/dirlink && ln -s /nope ~/dangling")
    link = sandbox.files.get_info("/home/user/link")
    assert (link.name, link.path, link.type, link.symlink_target) == (
        "link",
        "/home/user/link",
        FileType.SYMLINK,
        "/home/user/target.txt",
    )
    assert sandbox.files.get_info("/home/user/target.txt").symlink_target is None
    assert sandbox.files.get_info("/home/user/dirlink").symlink_target == "/home/user"
    assert sandbox.files.get_info("/home/user/dangling").symlink_target == "/nope"
    listed = {e.name: e for e in sandbox.files.list("/home/user")}
    assert listed["link"].type == FileType.SYMLINK and listed["link"].symlink_target == "/home/user/target.txt"

    status = sandbox.files.read("/proc/self/status")  # stat says 0 bytes; the content is there
    assert "Name:" in status and "Pid:" in status
    assert sandbox.files.read("/proc/version").startswith("Linux version")


def test_filesystem_async(adx_up: Up, sandbox: Sandbox) -> None:
    async def main() -> None:
        connected = await AsyncSandbox.connect(sandbox.sandbox_id, **adx_up.opts())
        await connected.files.remove("/work/missing-async")
        assert "Pid:" in await connected.files.read("/proc/self/status")

    asyncio.run(main())


# 4. GET /v2/sandboxes -----------------------------------------------------------------------------------------


def test_list_is_newest_first_and_filters_by_start_and_template(adx_up: Up) -> None:
    first = Sandbox.create(metadata={"suite": "order"}, **adx_up.opts())
    try:
        time.sleep(1.1)  # startedAt has second precision in some clients: keep the two apart
        between = datetime.now(UTC)
        second = Sandbox.create(metadata={"suite": "order"}, **adx_up.opts())
        try:
            query = SandboxQuery(metadata={"suite": "order"})
            ids = [s.sandbox_id for s in Sandbox.list(query=query, **adx_up.opts()).next_items()]
            assert ids == [second.sandbox_id, first.sandbox_id]  # newest first, E2B's default
            oldest_first = Sandbox.list(query=query, order="asc", **adx_up.opts()).next_items()
            assert [s.sandbox_id for s in oldest_first] == [first.sandbox_id, second.sandbox_id]

            after = SandboxQuery(metadata={"suite": "order"}, started_after=between)
            assert [s.sandbox_id for s in Sandbox.list(query=after, **adx_up.opts()).next_items()] == [
                second.sandbox_id
            ]
            later = SandboxQuery(started_after=datetime.now(UTC) + timedelta(hours=1))
            assert Sandbox.list(query=later, **adx_up.opts()).next_items() == []

            base = SandboxQuery(metadata={"suite": "order"}, template="base")
            assert len(Sandbox.list(query=base, **adx_up.opts()).next_items()) == 2
            other = SandboxQuery(metadata={"suite": "order"}, template="no-such-template")
            assert Sandbox.list(query=other, **adx_up.opts()).next_items() == []

            async def listed() -> list[str]:
                page = AsyncSandbox.list(query=after, **adx_up.opts())
                return [s.sandbox_id for s in await page.next_items()]

            assert asyncio.run(listed()) == [second.sandbox_id]
        finally:
            second.kill()
    finally:
        first.kill()


# 5. Command timeout -------------------------------------------------------------------------------------------


def test_the_server_ends_a_timed_out_command_with_deadline_exceeded(adx_up: Up, sandbox: Sandbox) -> None:
    """The deadline set only on the server (``Connect-Timeout-Ms`` without a client timer): at it, the stream
    ends with Connect's ``deadline_exceeded``, which the SDK raises as TimeoutException."""
    bounded = _sandbox_with_headers(adx_up, sandbox, {"Connect-Timeout-Ms": "1500"})
    started = time.monotonic()
    with pytest.raises(TimeoutException) as timed_out:
        bounded.commands.run("sleep 30", timeout=0)  # 0: no client-side deadline
    assert time.monotonic() - started < 15
    assert "deadline" in str(timed_out.value).lower()
    handle = bounded.commands.run("sleep 30", background=True, timeout=0)
    with pytest.raises(TimeoutException):
        handle.wait()
    # A command that finishes first ends normally.
    assert bounded.commands.run("echo quick", timeout=0).stdout == "quick\n"

    async def main() -> None:
        from e2b import ConnectionConfig

        config = ConnectionConfig(
            api_key=adx_up.key,
            api_url=adx_up.url,
            sandbox_url=adx_up.url,
            extra_sandbox_headers=dict(bounded.connection_config.sandbox_headers),
        )
        async_bounded = AsyncSandbox(
            sandbox_id=sandbox.sandbox_id,
            envd_version=sandbox._envd_version,
            envd_access_token=sandbox._envd_access_token,
            sandbox_domain=None,
            connection_config=config,
        )
        with pytest.raises(TimeoutException):
            await async_bounded.commands.run("sleep 30", timeout=0)

    asyncio.run(main())


# 6. A killed sandbox ------------------------------------------------------------------------------------------


def test_a_killed_sandbox_raises_sandbox_not_running(adx_up: Up) -> None:
    sandbox = Sandbox.create(**adx_up.opts())
    assert sandbox.is_running()
    Sandbox.kill(sandbox.sandbox_id, **adx_up.opts())
    assert sandbox.is_running() is False
    with pytest.raises(SandboxNotRunningException):
        sandbox.commands.run("echo gone")
    with pytest.raises(SandboxNotRunningException):
        sandbox.files.read("/etc/hostname")
    with pytest.raises(SandboxNotRunningException):
        sandbox.files.write("/work/x", "x")
    with pytest.raises(SandboxNotRunningException):
        sandbox.files.list("/work")

    # Killed while a command streams: the broken stream is probed with /health, which must say "not found".
    running = Sandbox.create(**adx_up.opts())
    handle = running.commands.run("sleep 60", background=True)
    Sandbox.kill(running.sandbox_id, **adx_up.opts())
    with pytest.raises(SandboxNotRunningException):
        handle.wait()
    envd = running._envd_api
    health = envd.get("/health")
    assert health.status_code == 502 and "was not found" in health.json()["message"]
    assert health.json()["code"] == 502

    async def main() -> None:
        made = await AsyncSandbox.create(**adx_up.opts())
        await made.kill()
        assert await made.is_running() is False
        with pytest.raises(SandboxNotRunningException):
            await made.commands.run("echo gone")
        with pytest.raises(SandboxNotRunningException):
            await made.files.read("/etc/hostname")

    asyncio.run(main())
