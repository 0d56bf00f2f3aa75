"""`adx env token create|list|revoke` as a user runs them: real subprocesses against the real API server,
Coordinator, Redis, adxlet, Relay and sandbox; the printed token is then used on the data plane (SEC-4)."""

from __future__ import annotations

import json

import httpx
import pytest
from apistack import ApiStack, adx_cli, api_for, as_user  # noqa: F401  (fixtures)

import adx


@pytest.mark.req("SEC-4")
async def test_env_token_create_list_use_revoke(node_cluster, api_for) -> None:  # noqa: F811
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("acme")
    user = as_user(stack, key)
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)

    code, out, err = await adx_cli("env", "token", "create", env.id, "--ttl", "1h30m", "--json", env=user)
    assert code == 0, err
    issued = json.loads(out)
    assert issued["token"].startswith("adxt_") and issued["environmentId"] == env.id and issued["port"] is None
    assert issued["expiresAt"] - issued["createdAt"] == pytest.approx(5400)

    code, out, err = await adx_cli("env", "token", "create", env.id, "--port", "8000", env=user)
    assert code == 0, err
    assert "port 8000 only" in out and "never (until revoked)" in out and "shown only now" in out
    link = next(line.split()[1] for line in out.splitlines() if line.startswith("link"))
    assert link.startswith(f"{stack.url}/v1/environments/{env.id}/ports/8000/?adx_token=adxt_")
    port_token_id = next(line.split()[1] for line in out.splitlines() if line.startswith("id"))

    code, out, err = await adx_cli("env", "token", "list", env.id, env=user)
    assert code == 0, err
    assert issued["id"] in out and port_token_id in out and "adxt_" not in out  # never a secret
    code, out, err = await adx_cli("env", "token", "list", env.id, "--json", env=user)
    assert code == 0, err
    assert {t["id"] for t in json.loads(out)["tokens"]} == {issued["id"], port_token_id}
    assert out == json.dumps(json.loads(out), indent=2) + "\n", out  # the one --json style (docs/cli.md#output)

    # The printed token works on the data plane, with no API key anywhere.
    commands = f"{stack.url}/v1/environments/{env.id}/commands"
    auth = {"Authorization": f"Bearer {issued['token']}"}
    async with httpx.AsyncClient(timeout=10) as http:
        ran = await http.post(commands, json={"command": "echo from-cli-token"}, headers=auth)
        assert ran.status_code == 200 and "from-cli-token" in ran.text

        code, out, err = await adx_cli("env", "token", "revoke", env.id, issued["id"], env=user)
        assert code == 0, err
        assert f"revoked {issued['id']}" in out
        refused = await http.post(commands, json={"command": "true"}, headers=auth)
        assert refused.status_code == 401

    # Input errors name the flag; unknown tokens are "not found" (exit 3), both with the reason.
    code, _, err = await adx_cli("env", "token", "create", env.id, "--ttl", "soon", env=user)
    assert code == 2 and "--ttl" in err
    code, _, err = await adx_cli("env", "token", "create", env.id, "--port", "70000", env=user)
    assert code == 2 and "port" in err
    code, _, err = await adx_cli("env", "token", "revoke", env.id, issued["id"], env=user)
    assert code == 3 and "revoked already" in err
    code, out, err = await adx_cli("env", "token", "list", env.id, env=user)
    assert code == 0 and issued["id"] not in out and port_token_id in out
