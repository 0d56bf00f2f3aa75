"""``adx node drain`` on the real stack (issue 17's must-show): two real adxlets with their sandboxds and a shared
checkpoint storage, the real Coordinator on Redis and the real API server. A node holding three Environments
(one running, one paused, one idle) is drained; all three are then used on the other node, with their files."""

from __future__ import annotations

import json

import httpx
import pytest
from apistack import ApiStack, admin_key

import adx

SHARED = adx.PausePolicy(storage=adx.CheckpointStorage.SHARED)


@pytest.mark.req("CRD-5", "CRD-6", "ENV-3")
async def test_drain_pauses_what_runs_and_everything_resumes_on_the_other_node(node_cluster, api_for) -> None:
    nc = await node_cluster(nodes=("n1", "n2"), shared_checkpoints=True)
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with (
        stack.http(await admin_key(stack)) as admin,
        adx.AsyncClient(api_url=stack.url, api_key=key) as client,
    ):
        # Everything on n1: n2 is cordoned while they are created (placement honours it), then opened again.
        assert (await admin.post("/v1/admin/nodes/n2/cordon")).status_code == 200
        running = await client.environments.create(cpu=0.25, memory="256Mi", pause=SHARED)
        paused = await client.environments.create(cpu=0.25, memory="256Mi", pause=SHARED)
        idle = await client.environments.create(
            cpu=0.25, memory="256Mi", pause=SHARED, idle_timeout=3600, idle_action=adx.IdleAction.PAUSE
        )
        assert (await admin.post("/v1/admin/nodes/n2/uncordon")).status_code == 200
        envs = {"running": running, "paused": paused, "idle": idle}
        for name, env in envs.items():
            assert env.node == "n1"
            await env.files.write("/work/who.txt", name.encode())
        await paused.pause()
        checkpoint_of_paused = paused.checkpoint.id

        async with admin.stream("POST", "/v1/admin/nodes/n1/drain", timeout=httpx.Timeout(120)) as answer:
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("application/x-ndjson")
            events = [json.loads(line) async for line in answer.aiter_lines() if line.strip()]
        steps = [(e["step"], e["environmentId"]) for e in events]
        assert steps[0] == ("cordoned", "") and steps[-1][0] == "done"
        by_env = {env_id: [s for s, e in steps if e == env_id] for env_id in (running.id, paused.id, idle.id)}
        assert by_env == {running.id: ["pausing", "paused"], paused.id: ["kept"], idle.id: ["pausing", "paused"]}
        assert all("resumes on another node" in e["message"] for e in events if e["step"] in ("paused", "kept"))

        for env in envs.values():
            assert (await env.refresh()).state == "paused"
        assert paused.checkpoint.id == checkpoint_of_paused  # the paused one stayed as it was
        nodes = {n["name"]: n for n in (await admin.get("/v1/admin/nodes")).json()}
        assert nodes["n1"]["cordoned"] and nodes["n1"]["environments"] == {"paused": 3}

        # Their next use resumes each on n2, with its files.
        for name, env in envs.items():
            assert await env.files.read("/work/who.txt") == name.encode()
            result = await env.commands.run("cat /work/who.txt")
            assert result.stdout == name
            await env.refresh()
            assert env.state == "running" and env.node == "n2", (name, env.state, env.node)

        # Draining again finds nothing left on n1; an unknown node is a 404 before any stream starts.
        again = await admin.post("/v1/admin/nodes/n1/drain")
        lines = [json.loads(line) for line in again.text.splitlines()]
        assert [e["step"] for e in lines] == ["cordoned", "done"] and lines[-1]["message"] == "no Environments"
        missing = await admin.post("/v1/admin/nodes/n9/drain")
        assert missing.status_code == 404 and "node n9 not found" in missing.json()["error"]["message"]


async def test_drain_says_a_local_checkpoint_stays_on_its_node(node_cluster, api_for) -> None:
    nc = await node_cluster(nodes=("n1",))
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("beta")
    async with (
        stack.http(await admin_key(stack)) as admin,
        adx.AsyncClient(api_url=stack.url, api_key=key) as client,
    ):
        env = await client.environments.create(cpu=0.25, memory="256Mi")
        await env.files.write("/work/x", b"kept")
        lines = [json.loads(line) for line in (await admin.post("/v1/admin/nodes/n1/drain")).text.splitlines()]
        paused = next(e for e in lines if e["step"] == "paused")
        assert paused["environmentId"] == env.id
        assert "local to node n1: it resumes only there (uncordon it)" in paused["message"]
        assert (await env.refresh()).state == "paused"
        # Once the node is uncordoned it resumes there, files intact.
        await admin.post("/v1/admin/nodes/n1/uncordon")
        assert await env.files.read("/work/x") == b"kept"
