"""Small programs of the kind in E2B's docs, run with the real ``e2b`` SDK (sync and async) against ``adx up``:
commands whose behaviour differed from envd's (the variables E2B sets for every command, what
``commands.list`` reports of a running command)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import AsyncSandbox, Sandbox

pytestmark = pytest.mark.slow


@pytest.fixture
def sandbox(adx_up: Up) -> Iterator[Sandbox]:
    made = Sandbox.create(envs={"MY_VAR": "my_value"}, **adx_up.opts())
    yield made
    made.kill()


def test_commands_see_e2bs_sandbox_variables(sandbox: Sandbox) -> None:
    """E2B sets E2B_SANDBOX, E2B_SANDBOX_ID, E2B_TEAM_ID and E2B_TEMPLATE_ID for commands (its docs: 'knowing if
    you are inside a sandbox'); the create's and the command's own ``envs`` still apply, the command's last."""
    result = sandbox.commands.run('echo "$E2B_SANDBOX $E2B_SANDBOX_ID $E2B_TEAM_ID $E2B_TEMPLATE_ID $MY_VAR"')
    # The team is the key's tenant: adx up's key is tenant "default"'s.
    assert result.stdout == f"true {sandbox.sandbox_id} default base my_value\n"
    assert sandbox.commands.run("echo $E2B_SANDBOX_ID", user="root").stdout == f"{sandbox.sandbox_id}\n"
    assert sandbox.commands.run("echo $MY_VAR $E2B_SANDBOX", envs={"MY_VAR": "mine"}).stdout == "mine true\n"


def test_commands_list_reports_the_started_config(sandbox: Sandbox) -> None:
    """envd's List answers each running process's config as it was started: ``envs`` and ``cwd`` included."""
    handle = sandbox.commands.run("sleep 60", background=True, envs={"JOB": "7"}, cwd="/tmp")
    plain = sandbox.commands.run("sleep 60", background=True)
    listed = {p.pid: p for p in sandbox.commands.list()}
    assert (listed[handle.pid].cmd, listed[handle.pid].args) == ("/bin/bash", ["-l", "-c", "sleep 60"])
    assert (listed[handle.pid].envs, listed[handle.pid].cwd) == ({"JOB": "7"}, "/tmp")
    assert (listed[plain.pid].envs, listed[plain.pid].cwd) == ({}, None)
    handle.kill()
    plain.kill()


async def test_command_programs_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(**adx_up.opts())
    try:
        result = await sandbox.commands.run("echo $E2B_SANDBOX $E2B_SANDBOX_ID")
        assert result.stdout == f"true {sandbox.sandbox_id}\n"
        handle = await sandbox.commands.run("sleep 60", background=True, envs={"JOB": "8"}, cwd="/tmp")
        (listed,) = [p for p in await sandbox.commands.list() if p.pid == handle.pid]
        assert (listed.envs, listed.cwd) == ({"JOB": "8"}, "/tmp")
        await handle.kill()
    finally:
        await sandbox.kill()
