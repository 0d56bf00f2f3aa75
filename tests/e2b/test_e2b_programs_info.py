"""Small programs of the kind in E2B's docs, run with the real ``e2b`` SDK (sync and async) against ``adx up``:
what ``get_info`` says of a sandbox (its lifecycle, template name and network options) and how an unknown
template is refused and how the list pages, where ADX's answers differed from E2B's API."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import AsyncSandbox, Sandbox, SandboxQuery
from e2b.exceptions import SandboxException

pytestmark = pytest.mark.slow


def test_get_info_reports_lifecycle_template_name_and_network(adx_up: Up) -> None:
    """E2B's sandbox detail carries ``lifecycle`` (``on_timeout``, ``auto_resume``), the template's ``alias``
    (the SDK's ``name``) and the network options the sandbox was made with."""
    plain = Sandbox.create(**adx_up.opts())
    pausing = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True}, **adx_up.opts())
    closed = Sandbox.create(allow_internet_access=False, **adx_up.opts())
    listed = Sandbox.create(network={"deny_out": ["0.0.0.0/0"], "allow_out": ["10.1.2.3"]}, **adx_up.opts())
    try:
        info = plain.get_info()
        assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
        assert (info.template_id, info.name) == ("base", "base")
        assert (info.allow_internet_access, info.network) == (None, None)  # nothing said at create
        assert pausing.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        assert closed.get_info().allow_internet_access is False
        assert listed.get_info().network == {"allow_out": ["10.1.2.3"], "deny_out": ["0.0.0.0/0"]}
        (row,) = [s for s in Sandbox.list(**adx_up.opts()).next_items() if s.sandbox_id == plain.sandbox_id]
        assert row.name == "base"
    finally:
        for sandbox in (plain, pausing, closed, listed):
            sandbox.kill()


def test_an_unknown_template_is_not_found(adx_up: Up) -> None:
    """E2B answers 404 ``template '...' not found`` (the SDK raises ``SandboxException`` with that status)."""
    with pytest.raises(SandboxException, match="not found") as refused:
        Sandbox.create(template="no-such-template", **adx_up.opts())
    assert refused.value.status_code == 404


async def test_info_programs_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(lifecycle={"on_timeout": "pause"}, **adx_up.opts())
    try:
        info = await sandbox.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}
        assert info.name == "base"
        with pytest.raises(SandboxException) as refused:
            await AsyncSandbox.create(template="no-such-template", **adx_up.opts())
        assert refused.value.status_code == 404
    finally:
        await sandbox.kill()


def test_paging_goes_on_when_a_listed_sandbox_goes_away(adx_up: Up) -> None:
    """A program pages through ``Sandbox.list`` while sandboxes end (its own cleanup, timeouts): E2B's next token
    is a position in the order, so the next page holds the sandboxes after it whatever went away; a token that
    is no position at all is E2B's 400 "Invalid next token"."""
    tag = {"paging": str(time.time())}
    made = [Sandbox.create(metadata=tag, **adx_up.opts()) for _ in range(3)]
    try:
        newest_first = [s.sandbox_id for s in reversed(made)]
        pages = Sandbox.list(query=SandboxQuery(metadata=tag), limit=1, **adx_up.opts())
        assert [s.sandbox_id for s in pages.next_items()] == newest_first[:1]
        Sandbox.kill(newest_first[1], **adx_up.opts())  # the one the next page starts with
        assert [s.sandbox_id for s in pages.next_items()] == newest_first[2:]
        assert not pages.has_next
        with pytest.raises(SandboxException, match=r"(?i)invalid next token") as refused:
            Sandbox.list(next_token="garbage", **adx_up.opts()).next_items()
        assert refused.value.status_code == 400
    finally:
        for sandbox in made:
            sandbox.kill()


def test_a_timeout_past_the_longest_lifetime_is_refused_naming_timeout(adx_up: Up) -> None:
    """The SDK's field is ``timeout`` (create, ``set_timeout``, ``connect``): a refusal names it, not ADX's own."""
    with pytest.raises(SandboxException, match=r"^400: timeout: must be at most 2592000") as refused:
        Sandbox.create(timeout=10**9, **adx_up.opts())
    assert refused.value.status_code == 400
    sandbox = Sandbox.create(**adx_up.opts())
    try:
        with pytest.raises(SandboxException, match=r"^400: timeout: must be at most 2592000"):
            sandbox.set_timeout(31 * 86400)
        with pytest.raises(SandboxException, match=r"^400: timeout: must be at most 2592000"):
            Sandbox.connect(sandbox.sandbox_id, timeout=10**9, **adx_up.opts())
        sandbox.set_timeout(30 * 86400)  # the longest is fine
    finally:
        sandbox.kill()


def test_auto_resume_false_keeps_a_paused_sandbox_paused_until_connect(adx_up: Up) -> None:
    """``lifecycle={"on_timeout": "pause", "auto_resume": False}``: ``get_info`` says so; once paused, the
    sandbox's own traffic (a command, a file read, a ``get_host`` port) gets E2B's proxy answer for a paused
    sandbox (409) and does not wake it; ``Sandbox.connect`` resumes it and its traffic works again."""
    sandbox = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": False}, **adx_up.opts())
    try:
        assert sandbox.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        sandbox.files.write("kept.txt", "kept")
        assert sandbox.pause() is True
        with pytest.raises(SandboxException, match="paused and auto-resume is off"):
            sandbox.commands.run("echo woken")
        with pytest.raises(SandboxException, match="409"):
            sandbox.files.read("kept.txt")
        port = httpx.get(adx_up.url + "/", headers={"Host": sandbox.get_host(8000)}, timeout=30)
        assert port.status_code == 409 and "auto-resume is off" in port.json()["message"], port.text
        assert sandbox.get_info().state.value == "paused"  # none of it woke the sandbox
        Sandbox.connect(sandbox.sandbox_id, **adx_up.opts())
        assert sandbox.commands.run("cat kept.txt").stdout == "kept"
        assert sandbox.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
    finally:
        sandbox.kill()


async def test_auto_resume_false_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": False}, **adx_up.opts())
    try:
        assert (await sandbox.get_info()).lifecycle == {"on_timeout": "pause", "auto_resume": False}
        assert await sandbox.pause() is True
        with pytest.raises(SandboxException, match="paused and auto-resume is off"):
            await sandbox.commands.run("true")
        assert (await sandbox.get_info()).state.value == "paused"
        await sandbox.connect()
        assert (await sandbox.commands.run("echo back")).stdout == "back\n"
    finally:
        await sandbox.kill()
