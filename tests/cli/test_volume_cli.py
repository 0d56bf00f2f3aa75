"""`adx volume create|ls|rm` and `adx env create --volume NAME=/PATH` as a user runs them: real subprocesses
against a real API server and Coordinator (docs/volumes.md)."""

from __future__ import annotations

import json
from pathlib import Path

from apistack import ApiStack, adx_cli, api_stack, as_user  # noqa: F401  (fixtures)


async def test_volume_create_ls_mount_rm(api_stack, tmp_path: Path) -> None:  # noqa: F811
    stack: ApiStack = await api_stack(volumes_dir=tmp_path / "volumes")
    key = await stack.tenant("acme")
    node = await stack.register_node("n1")
    user = as_user(stack, key)

    code, out, err = await adx_cli("volume", "create", "data", "--json", env=user)
    assert code == 0, err
    volume = json.loads(out)
    assert volume["name"] == "data" and volume["id"].startswith("vol-")
    assert out == json.dumps(volume, indent=2) + "\n", out  # the one --json style (docs/cli.md#output)
    code, out, err = await adx_cli("volume", "create", "data", env=user)
    assert code == 4 and "data" in err, (code, err)  # conflict: the name is taken
    code, out, err = await adx_cli("volume", "ls", env=user)
    assert code == 0 and volume["id"] in out and "data" in out, err

    bad = await adx_cli("env", "create", "--volume", "data", "--no-wait", env=user)
    assert bad[0] == 2 and "--volume" in bad[2], bad
    code, out, err = await adx_cli("env", "create", "--volume", "data=/mnt/d", "--no-wait", "--json", env=user)
    assert code == 0, err
    env = json.loads(out)
    assert env["volumes"] == [{"name": "data", "path": "/mnt/d"}]
    assert out == json.dumps(env, indent=2) + "\n", out
    code, out, err = await adx_cli("volume", "rm", "data", env=user)
    assert code == 4 and env["id"] in err, (code, err)  # mounted: refused

    await stack.mark_running(node, env["id"])
    # The node's delete, as it commits it (the Coordinator refuses running -> deleted in one step).
    await stack.commit(node, env["id"], {"state": "deleting"})
    await stack.commit(node, env["id"], {"state": "deleted"})
    code, out, err = await adx_cli("volume", "rm", "data", env=user)
    assert code == 0 and volume["id"] in out, err
    code, out, err = await adx_cli("volume", "rm", "data", env=user)
    assert code == 3, (code, err)  # not found
    code, out, err = await adx_cli("volume", "ls", "--json", env=user)
    assert code == 0 and out == '{\n  "volumes": []\n}\n', (out, err)
