"""Data plane end to end on real parts: SDK -> API server + Ingress -> Coordinator (Redis) -> the lead's
adxlet and Relay (mTLS) -> sandboxd sandbox -> execd."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest
from apistack import ApiStack

import adx


async def wait_deleted(client: adx.AsyncClient, env_id: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while (await client.environments.get(env_id)).state != "deleted":
        assert time.monotonic() < deadline, "the Environment was not deleted in time"
        await asyncio.sleep(0.05)


@pytest.mark.req("SEC-2", "SEC-4")
async def test_create_run_files_delete_through_ingress_and_relay(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key_a, key_b = await stack.tenant("alpha"), await stack.tenant("beta")
    async with adx.AsyncClient(api_url=stack.url, api_key=key_a) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        assert env.state == "running" and env.node == "n1" and env.execution_id

        result = await env.commands.run("echo hi; echo oops >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "hi\n", "oops\n")
        assert (await env.commands.run(["sh", "-c", "echo $((6*7))"])).stdout == "42\n"

        # Output is streamed as produced, not buffered until the command ends.
        seen: list[tuple[float, str]] = []
        async with env.commands.stream("echo first; sleep 1; echo second") as running:
            async for chunk in running:
                seen.append((time.monotonic(), chunk.data))
            final = await running.result()
        assert final.exit_code == 0 and "".join(d for _, d in seen) == "first\nsecond\n"
        assert seen[-1][0] - seen[0][0] >= 0.8, seen

        await env.files.write("/tmp/a.txt", b"data")
        assert await env.files.read("/tmp/a.txt") == b"data"
        blob = os.urandom(3 * 2**20)  # larger than any buffer on the way: streamed both ways
        await env.files.write("/tmp/blob", blob)
        assert await env.files.read("/tmp/blob") == blob
        assert (await env.files.stat("/tmp/blob"))["size"] == len(blob)
        assert {"a.txt", "blob"} <= {e["name"] for e in await env.files.list("/tmp")}
        await env.files.delete("/tmp/a.txt")
        with pytest.raises(adx.NotFoundError):
            await env.files.read("/tmp/a.txt")

        # Tenant B: every data-plane route is a 404, and nothing reaches the sandbox (SEC-4: check first).
        async with stack.http(key_b) as b:
            base = f"/v1/environments/{env.id}"
            ran = await b.post(f"{base}/commands", json={"command": "touch /tmp/pwned"})
            assert ran.status_code == 404 and ran.json()["error"]["code"] == "not_found"
            wrote = await b.put(f"{base}/files", params={"path": "/tmp/pwned"}, content=b"x")
            assert wrote.status_code == 404
            assert (await b.get(f"{base}/files", params={"path": "/tmp/blob"})).status_code == 404
            assert (await b.delete(f"{base}/files", params={"path": "/tmp/blob"})).status_code == 404
        async with stack.http(None) as anonymous:
            assert (
                await anonymous.post(f"/v1/environments/{env.id}/commands", json={"command": "true"})
            ).status_code == 401
        with pytest.raises(adx.NotFoundError):
            await env.files.read("/tmp/pwned")
        assert await env.files.read("/tmp/blob") == blob

        # The synchronous twin over the same path.
        def sync_run() -> adx.CommandResult:
            with adx.Client(api_url=stack.url, api_key=key_a) as sync:
                return sync.environments.get(env.id).commands.run("echo sync")

        assert (await asyncio.to_thread(sync_run)).stdout == "sync\n"

        execution = env.execution_id
        await env.delete()
        await wait_deleted(client, env.id)
        sandboxes = await nc.nodes["n1"].driver.client.list()
        assert execution not in {s.sandbox_id for s in sandboxes}  # the sandbox (and its cgroup) is gone
        with pytest.raises(adx.ConflictError) as gone:
            await env.commands.run("true")
        assert gone.value.code == "not_running"


@pytest.mark.req("SEC-4")
async def test_user_ports_are_proxied_into_the_sandbox_after_the_tenant_check(node_cluster, api_for) -> None:
    """A service listening on 127.0.0.1 inside the sandbox's own network namespace, reached through
    Ingress -> Relay (which connects from within that namespace)."""
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key_a, key_b = await stack.tenant("alpha"), await stack.tenant("beta")
    async with adx.AsyncClient(api_url=stack.url, api_key=key_a) as client:
        env = await client.environments.create(
            cpu=0.25,
            memory="256Mi",
            entrypoint=["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp"],
            wait_timeout=30,
        )
        await env.files.write("/tmp/hello.txt", b"hello from inside\n")
        async with stack.http(key_a) as a, stack.http(key_b) as b:
            deadline = time.monotonic() + 20
            while True:
                served = await a.get(f"/v1/environments/{env.id}/ports/8000/hello.txt")
                if served.status_code != 502 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)  # the workload is still binding its port
            assert served.status_code == 200, served.text
            assert served.content == b"hello from inside\n"
            listing = await a.get(f"/v1/environments/{env.id}/ports/8000/", params={"x": "1"})
            assert listing.status_code == 200 and "hello.txt" in listing.text
            # Nothing listens on 8001: a clear error, not a hang.
            missing = await a.get(f"/v1/environments/{env.id}/ports/8001/")
            assert missing.status_code == 502 and missing.json()["error"]["code"] == "port_unavailable"
            # Another tenant learns nothing, and nothing reaches the service.
            assert (await b.get(f"/v1/environments/{env.id}/ports/8000/hello.txt")).status_code == 404
            assert (await a.get(f"/v1/environments/{env.id}/ports/70000/")).status_code == 422
        # The host's own loopback is not the sandbox's: nothing listens on the host's 127.0.0.1:8000.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", 8000), timeout=1).close()
        await env.delete()
        await wait_deleted(client, env.id)


async def test_unreachable_relay_and_slow_starts_get_clear_503s(api_stack) -> None:
    stack: ApiStack = await api_stack(route_cache_seconds=0, start_wait_seconds=0.3)
    key = await stack.tenant("alpha")
    node = await stack.register_node("n1", relay_address="127.0.0.1:1")
    spec = {"resources": {"cpuMillis": 250, "memoryBytes": 2**28}}
    async with stack.http(key) as http:
        pending = (await http.post("/v1/environments", json=spec)).json()
        started = time.monotonic()
        waited = await http.post(f"/v1/environments/{pending['id']}/commands", json={"command": "true"})
        assert waited.status_code == 503 and waited.json()["error"]["code"] == "environment_starting"
        assert 0.2 <= time.monotonic() - started < 5  # it waited for the start, within its bound

        env = (await http.post("/v1/environments", json=spec)).json()
        await stack.mark_running(node, env["id"])
        response = await http.post(f"/v1/environments/{env['id']}/commands", json={"command": "true"})
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "relay_unavailable"

        missing = await http.post("/v1/environments/env-" + "a" * 26 + "/commands", json={"command": "true"})
        malformed = await http.get("/v1/environments/nope/files", params={"path": "/x"})
        assert missing.status_code == malformed.status_code == 404
    async with adx.AsyncClient(api_url=stack.url, api_key=key, retries=0) as client:
        with pytest.raises(adx.UnavailableError) as caught:
            await (await client.environments.get(env["id"])).commands.run("true")
        assert caught.value.code == "relay_unavailable"
