"""`adx tenant create` and `adx env ...` as a user runs them: real subprocesses against the real API server,
Coordinator and Redis (and, for exec, the real adxlet, Relay, sandboxd and execd)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from apistack import ADX, ApiStack, adx_cli, api_for, api_stack, as_user  # noqa: F401  (fixtures)


async def test_tenant_create_then_env_create_list_get_delete(api_stack) -> None:  # noqa: F811
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
    async with stack.http(key) as http:
        answer = (await http.get(f"/v1/environments/{created['id']}")).json()
    # --json is the HTTP object itself (docs/cli.md#output), not a selection of it: every key, in its order.
    assert list(json.loads(got).items()) == list(answer.items()), (got, answer)
    assert text.startswith(f"id               {created['id']}")

    code, out, err = await adx_cli("env", "delete", created["id"], env=user)
    assert code == 0 and out.split()[0] == created["id"], err


@pytest.mark.req("ENV-5")
async def test_env_errors_exit_with_their_family_code(api_stack) -> None:  # noqa: F811
    stack: ApiStack = await api_stack()
    await stack.register_node("n1")
    user = as_user(stack, await stack.tenant("acme"))
    negative, action, missing, wrong_key = await asyncio.gather(
        adx_cli("env", "create", "--cpu", "-1", env=user),
        adx_cli("env", "create", "--idle-action", "sleep", env=user),
        adx_cli("env", "get", "env-" + "a" * 26, env=user),
        adx_cli("env", "list", env={**user, "ADX_API_KEY": "adx_wrong"}),
    )
    assert negative[0] == 2 and "adx: error: --cpu: must not be negative, got -1\n" in negative[2], negative
    assert action[0] == 2 and "adx: error: --idle-action: must be one of delete, pause" in action[2]
    assert missing[0] == 3 and "not found" in missing[2]
    # A wrong key is an authentication failure (its own exit status), naming the API and the fix.
    assert wrong_key[0] == 7 and "unknown API key" in wrong_key[2], wrong_key
    assert f"the ADX API at {stack.url} refused the key" in wrong_key[2] and "adx tenant create" in wrong_key[2]
    assert await stack.cluster.coordinator.store.load_all_environments() == []


async def test_env_exec_streams_output_and_exits_with_the_commands_code(node_cluster, api_for) -> None:  # noqa: F811
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


@pytest.mark.req("ENV-1", "ENV-3", "ENV-5", "RST-2")
async def test_lifecycle_flags_refuse_bad_values_naming_the_flag(api_stack) -> None:  # noqa: F811
    stack: ApiStack = await api_stack()
    await stack.register_node("n1")
    user = as_user(stack, await stack.tenant("acme"))
    code, out, err = await adx_cli("env", "create", "--no-wait", "--json", env=user)
    assert code == 0, err
    env_id = json.loads(out)["id"]
    cases = [
        (("env", "create", "--retention", "ttl:soon"), "--retention: expected ttl:SECONDS, ttl or forever"),
        (("env", "create", "--retention", "ttl:0"), "--retention: "),
        (("env", "create", "--retention", "forever:9"), "--retention: expected"),
        (("env", "create", "--storage", "nfs"), "--storage: "),
        (("env", "create", "--pause-timeout", "0"), "--pause-timeout: "),
        (("env", "create", "--backoff", "0"), "--backoff: "),
        # A cap below the initial delay is valid (the cap wins: RestartPolicy); a cap of 0 is not.
        (("env", "create", "--max-backoff", "0"), "--max-backoff: "),
        (("env", "create", "--max-retries", "-1"), "--max-retries: "),
        (("env", "create", "--lifetime", "0"), "--lifetime: "),
        (("env", "create", "--lifetime", "60", "--lifetime-action", "sleep"), "--lifetime-action: must be one of"),
        (("env", "lifetime", env_id, "0"), "SECONDS: "),
        (("env", "lifetime", env_id, "60", "--action", "sleep"), "--action: must be one of delete, pause"),
    ]
    results = await asyncio.gather(*(adx_cli(*args, env=user) for args, _ in cases))
    for (args, expected), (code, _, err) in zip(cases, results, strict=True):
        assert code == 2 and f"adx: error: {expected}" in err, (args, code, err)
    # Nothing but the first Environment was created.
    assert len(await stack.cluster.coordinator.store.load_all_environments()) == 1


@pytest.mark.req("ENV-1", "ENV-3", "CRD-5", "MET-1")
async def test_env_create_with_policies_then_pause_resume_lifetime(node_cluster, api_for) -> None:  # noqa: F811
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    user = as_user(stack, await stack.tenant("acme"))
    code, out, err = await adx_cli(
        "env", "create", "--cpu", "0.25", "--memory", "256Mi", "--retention", "forever", "--storage", "local",
        "--pause-timeout", "60", "--max-retries", "2", "--backoff", "0.5", "--max-backoff", "5",
        "--lifetime", "600", "--lifetime-action", "pause", "--json", env=user,
    )  # fmt: skip
    assert code == 0, err
    created = json.loads(out)
    env_id, lifecycle = created["id"], created["lifecycle"]
    assert created["state"] == "running" and created["expiresAt"] > time.time() + 590
    assert lifecycle["pauseOptions"] == {"retention": {"kind": "forever"}, "timeoutSeconds": 60, "storage": "local"}
    assert lifecycle["restartPolicy"] == {"maxRetries": 2, "initialBackoffSeconds": 0.5, "maxBackoffSeconds": 5.0}
    assert (lifecycle["lifetimeSeconds"], lifecycle["lifetimeAction"]) == (600, "pause")

    code, out, err = await adx_cli("env", "exec", env_id, "--shell", "--", "echo kept > /work/f", env=user)
    assert code == 0, err
    code, out, err = await adx_cli("env", "stats", env_id, env=user)
    assert code == 0 and "memory" in out and "of 256Mi" in out and "of 0.25 cores" in out, (out, err)
    code, out, err = await adx_cli("env", "stats", env_id, "--json", env=user)
    usage = json.loads(out)
    assert usage["environmentId"] == env_id and usage["memoryBytes"] > 0 and usage["cpuPercent"] is not None
    code, out, err = await adx_cli("env", "pause", env_id, env=user)
    assert (code, out.split()) == (0, [env_id, "paused"]), err
    (again, text) = await asyncio.gather(
        adx_cli("env", "pause", env_id, env=user), adx_cli("env", "get", env_id, env=user)
    )
    assert again[0] == 4 and "adx: error:" in again[2] and "already paused" in again[2]
    assert "state            paused" in text[1] and "checkpoint" in text[1] and "kept forever" in text[1]
    assert "expires" in text[1] and "-> pause" in text[1]
    code, out, err = await adx_cli("env", "stats", env_id, env=user)
    assert code == 4 and "is paused" in err, err  # usage of a paused Environment: refused, and it stays paused

    code, out, err = await adx_cli("env", "resume", env_id, env=user)
    assert (code, out.split()) == (0, [env_id, "running"]), err
    code, out, err = await adx_cli("env", "exec", env_id, "--", "cat", "/work/f", env=user)
    assert (code, out) == (0, "kept\n"), err

    code, out, err = await adx_cli("env", "lifetime", env_id, "1", "--action", "delete", env=user)
    assert code == 0 and out.startswith(f"{env_id} running expires ") and out.rstrip().endswith("-> delete"), err
    deadline = time.monotonic() + 20
    while json.loads((await adx_cli("env", "get", env_id, "--json", env=user))[1])["state"] != "deleted":
        assert time.monotonic() < deadline, "not deleted at its new deadline"
        await asyncio.sleep(0.5)
    code, _, err = await adx_cli("env", "resume", env_id, env=user)
    assert code == 4 and "adx: error:" in err, err
