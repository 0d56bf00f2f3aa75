"""`adx tenant create` and `adx env ...` as a user runs them: real subprocesses against the real API server,
Coordinator and Redis (and, for exec, the real adxlet, Relay, sandboxd and execd)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api"))

from apistack import ApiStack, api_for, api_stack  # noqa: F401  (fixtures)

ADX = [sys.executable, "-m", "adx"]


async def adx_cli(*args: str, env: dict[str, str] | None = None, limit: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *ADX,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), limit)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def as_user(stack: ApiStack, key: str) -> dict[str, str]:
    return {"ADX_API_URL": stack.url, "ADX_API_KEY": key, "XDG_CONFIG_HOME": "/nonexistent"}


async def test_tenant_create_then_env_create_list_get_delete(api_stack) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    stack: ApiStack = await api_stack()
    await stack.register_node("n1")
    certs = str(stack.config.certs_dir)
    code, out, err = await adx_cli(
        "tenant", "create", "acme", "--coordinator", stack.cluster.target, "--certs-dir", certs
    )
    assert code == 0, err
    key = out.strip()
    assert key and "\n" not in key and "not shown again" in err
    user = as_user(stack, key)

    code, out, err = await adx_cli(
        "env", "create", "--cpu", "500m", "--memory", "256Mi", "--metadata", "team=a", "--no-wait", "--json", env=user
    )
    assert code == 0, err
    created = json.loads(out)
    assert created["state"] == "pending" and created["resources"]["cpuMillis"] == 500
    assert created["metadata"] == {"team": "a"}

    # Independent reads run side by side (each CLI start costs ~1 s of imports).
    (c1, listed, e1), (c2, table, _), (c3, got, e3), (c4, text, _) = await asyncio.gather(
        adx_cli("env", "list", "--json", env=user),
        adx_cli("env", "list", env=user),
        adx_cli("env", "get", created["id"], "--json", env=user),
        adx_cli("env", "get", created["id"], env=user),
    )
    assert (c1, c2, c3, c4) == (0, 0, 0, 0), (e1, e3)
    assert [e["id"] for e in json.loads(listed)["environments"]] == [created["id"]]
    assert created["id"] in table and "pending" in table
    assert json.loads(got)["id"] == created["id"]
    assert text.startswith(f"id               {created['id']}")

    code, out, err = await adx_cli("env", "delete", created["id"], env=user)
    assert code == 0 and out.split()[0] == created["id"], err


@pytest.mark.req("ENV-5")
async def test_env_errors_exit_with_their_family_code(api_stack) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    stack: ApiStack = await api_stack()
    await stack.register_node("n1")
    user = as_user(stack, await stack.tenant("acme"))
    negative, action, missing, wrong_key = await asyncio.gather(
        adx_cli("env", "create", "--cpu", "-1", env=user),
        adx_cli("env", "create", "--idle-action", "sleep", env=user),
        adx_cli("env", "get", "env-" + "a" * 26, env=user),
        adx_cli("env", "list", env={**user, "ADX_API_KEY": "adx_wrong"}),
    )
    assert negative[0] == 2 and "adx: error: cpu: must not be negative" in negative[2]
    assert action[0] == 2 and "idle_action" in action[2]
    assert missing[0] == 3 and "not found" in missing[2]
    assert wrong_key[0] == 2 and "unknown API key" in wrong_key[2]
    assert await stack.cluster.coordinator.store.load_all_environments() == []


async def test_env_exec_streams_output_and_exits_with_the_commands_code(node_cluster, api_for) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    user = as_user(stack, await stack.tenant("acme"))
    code, out, err = await adx_cli("env", "create", "--cpu", "0.25", "--memory", "256Mi", "--json", env=user)
    assert code == 0, err
    env_id = json.loads(out)["id"]
    assert json.loads(out)["state"] == "running"

    failing, shell = await asyncio.gather(
        adx_cli("env", "exec", env_id, "--", "sh", "-c", "echo out; echo err >&2; exit 7", env=user),
        adx_cli("env", "exec", env_id, "--shell", "--", "echo $((6*7))", env=user),
    )
    assert failing == (7, "out\n", "err\n")
    assert shell[:2] == (0, "42\n")

    # Streaming: the first line is on our stdout while the command still runs.
    proc = await asyncio.create_subprocess_exec(
        *ADX,
        "env",
        "exec",
        env_id,
        "--",
        "sh",
        "-c",
        "echo first; sleep 1.5; echo second",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, **user},
    )
    assert proc.stdout is not None
    lines: list[tuple[float, bytes]] = []
    async for line in proc.stdout:
        lines.append((time.monotonic(), line))
    assert await proc.wait() == 0
    assert [line for _, line in lines] == [b"first\n", b"second\n"]
    assert lines[1][0] - lines[0][0] >= 1.0

    code, out, err = await adx_cli("env", "delete", env_id, "--wait", env=user)
    assert code == 0 and out.split() == [env_id, "deleted"], err
    code, _, err = await adx_cli("env", "exec", env_id, "--", "true", env=user)
    assert code == 4 and "not running" in err
