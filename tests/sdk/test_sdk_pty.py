"""``env.pty()`` (sync and async) against a real ``adx up``: a login shell on execd's pseudo-terminal through the
Ingress, written to, resized, interrupted with Ctrl-C, and killed on leaving the block (gone from the command
list)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator

import pytest
from cli_helpers import UpCluster, up_cluster  # noqa: F401  (fixture)

import adx
from adx.errors import InvalidInputError
from adx.sdk import AsyncPty, Pty

pytestmark = pytest.mark.slow


def _settings(cluster: UpCluster) -> tuple[str, str]:
    url = json.loads((cluster.state / "cluster.json").read_text())["api_url"]
    return url, json.loads((cluster.state / "credentials.json").read_text())["api_key"]


@pytest.fixture(scope="module")
def env(up_cluster: UpCluster) -> Iterator[adx.Environment]:  # noqa: F811
    url, key = _settings(up_cluster)
    with adx.Client(api_url=url, api_key=key) as client:
        created = client.environments.create(cpu=0.25, memory="128Mi")
        try:
            yield created.wait_until_running()
        finally:
            created.delete()


def read_until(term: Pty, pattern: str) -> str:
    """The terminal's output up to a match of ``pattern`` (the read itself blocks: pytest's timeout bounds it).
    Output lines start after CR or LF: bash ends bracketed paste (``ESC [?2004l``) and returns (CR) before it."""
    seen = ""
    for text in term:
        seen += text
        if re.search(pattern, seen):
            return seen
    raise AssertionError(f"the terminal ended before {pattern!r}: {seen!r}")


async def aread_until(term: AsyncPty, pattern: str) -> str:
    seen = ""
    async for text in term:
        seen += text
        if re.search(pattern, seen):
            return seen
    raise AssertionError(f"the terminal ended before {pattern!r}: {seen!r}")


def running_ids(env: adx.Environment) -> set[str]:
    answer = env._client.request("GET", f"/v1/environments/{env.id}/commands", what="list", idempotent=True)
    return {c["id"] for c in answer.json()["commands"]}


def test_a_login_shell_on_a_pty(env: adx.Environment) -> None:
    with env.pty(rows=30, cols=100) as term:
        assert term.id in running_ids(env)
        read_until(term, r"[#$] $")  # the prompt
        term.write("echo hello-$((6*7)); tty; stty size\r")
        out = read_until(term, r"[\r\n]30 100\r\n")
        assert "hello-42" in out and re.search(r"/dev/pts/\d+", out), out  # a terminal, not a pipe
        term.resize(12, 40)
        term.write("stty size\r")
        read_until(term, r"[\r\n]12 40\r\n")
        term.write("sleep 100\r")
        read_until(term, r"sleep 100\r\n")
        term.write("\x03")  # Ctrl-C: SIGINT from the line discipline to the foreground job
        term.write("echo status-$?\r")
        read_until(term, r"status-130")
        shell = term.id
    # Leaving the block killed the shell; execd lists it until it has reaped it.
    deadline = time.monotonic() + 10
    while shell in running_ids(env):
        assert time.monotonic() < deadline, f"{shell} still runs after the with block"
        time.sleep(0.1)


def test_the_exit_status_of_a_command_on_a_pty(env: adx.Environment) -> None:
    with env.pty(["/bin/sh", "-c", "read line; echo got-$line; exit 3"]) as term:
        term.write(b"abc\r")
        result = term.result
    assert result.exit_code == 3 and "got-abc" in result.stdout, result


def test_bad_sizes_name_the_field(env: adx.Environment) -> None:
    with pytest.raises(InvalidInputError) as refused:
        env.pty(rows=0)
    assert refused.value.field == "pty.rows"
    with pytest.raises(InvalidInputError) as refused:
        env.pty(cols=70000)
    assert refused.value.field == "pty.cols"


def test_async_pty(up_cluster: UpCluster, env: adx.Environment) -> None:  # noqa: F811
    url, key = _settings(up_cluster)
    env_id = env.id

    async def scenario() -> tuple[str, set[str]]:
        async with adx.AsyncClient(api_url=url, api_key=key) as client:
            env = await client.environments.get(env_id)
            async with env.pty(rows=20, cols=60) as term:
                await aread_until(term, r"[#$] $")
                await term.write("cd /tmp && pwd && stty size\r")
                out = await aread_until(term, r"[\r\n]20 60\r\n")
                shell = term.id
            listed = await client.request("GET", f"/v1/environments/{env_id}/commands", what="list", idempotent=True)
            return out, {shell} & {c["id"] for c in listed.json()["commands"]}

    out, still_listed = asyncio.run(scenario())
    assert re.search(r"[\r\n]/tmp\r\n", out) and not still_listed, (out, still_listed)
