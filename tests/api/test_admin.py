"""Admin over HTTP (issue 17): the admin key, tenants and their keys, nodes, cordon, cluster status, on a real
Coordinator (Redis) and the real API server. The node-level drain is in tests/lifecycle/test_drain.py."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from apistack import ApiStack, admin_key

from adx.proto import coordinator_pb2 as pb

SMALL = {"resources": {"cpuMillis": 100, "memoryBytes": 2**28}}


async def test_admin_routes_take_the_admin_key_and_refuse_a_tenant_key_with_403(api_stack) -> None:
    stack: ApiStack = await api_stack()
    tenant_key = await stack.tenant("acme")
    key = await admin_key(stack)
    async with stack.http(key) as admin, stack.http(tenant_key) as tenant, stack.http(None) as nobody:
        assert (await admin.get("/v1/admin/tenants")).status_code == 200
        refused = await tenant.get("/v1/admin/tenants")
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "forbidden"
        assert "tenant acme" in error["message"] and "admin key" in error["message"]
        missing = await nobody.get("/v1/admin/nodes")
        assert missing.status_code == 401 and "admin key" in missing.json()["error"]["message"]
        async with stack.http("adxa_not-a-key") as wrong:
            assert (await wrong.get("/v1/admin/cluster")).status_code == 401
        # The admin key is not a tenant key either.
        assert (await admin.get("/v1/environments")).status_code == 401
    # Only a hash of it is stored.
    raw = await stack.cluster.coordinator.store._redis.keys("adx:adminkey:*")
    assert raw and all(key.encode() not in k for k in raw)


async def test_tenants_create_list_disable_enable(api_stack) -> None:
    stack: ApiStack = await api_stack()
    await stack.register_node("n1")
    async with stack.http(await admin_key(stack)) as admin:
        made = await admin.post("/v1/admin/tenants", json={"name": "alice"})
        assert made.status_code == 201, made.text
        issued = made.json()
        assert issued["owner"] == "alice" and issued["apiKey"].startswith("adxk_")
        assert issued["keyId"].startswith("key_")
        again = await admin.post("/v1/admin/tenants", json={"name": "alice"})
        assert again.status_code == 409 and "adx key create alice" in again.json()["error"]["message"]
        bad = await admin.post("/v1/admin/tenants", json={"name": "no spaces"})
        assert bad.status_code == 422 and bad.json()["error"]["details"]["field"] == "name"
        listed = (await admin.get("/v1/admin/tenants")).json()
        alice = next(t for t in listed if t["name"] == "alice")
        assert alice["disabled"] is False and [k["id"] for k in alice["keys"]] == [issued["keyId"]]

        async with stack.http(issued["apiKey"]) as user:
            created = await user.post("/v1/environments", json={"resources": {"cpuMillis": 250, "memoryBytes": 2**28}})
            assert created.status_code in (200, 201), created.text
            env_id = created.json()["id"]
            disabled = await admin.post("/v1/admin/tenants/alice/disable")
            assert disabled.status_code == 200 and disabled.json()["disabled"] is True
            refused = await user.get("/v1/environments")
            assert refused.status_code == 401
            assert "tenant alice is disabled" in refused.json()["error"]["message"]
            # Its Environments are untouched.
            record = stack.cluster.coordinator.service.cache.environments[env_id]
            assert record.state.value not in ("deleting", "deleted")
            assert (await admin.post("/v1/admin/tenants/alice/enable")).json()["disabled"] is False
            assert [e["id"] for e in (await user.get("/v1/environments")).json()["environments"]] == [env_id]
        assert (await admin.post("/v1/admin/tenants/nobody/disable")).status_code == 404


async def test_keys_create_revoke_rotate(api_stack) -> None:
    stack: ApiStack = await api_stack()
    async with stack.http(await admin_key(stack)) as admin:
        first = (await admin.post("/v1/admin/tenants", json={"name": "bob"})).json()
        second = (await admin.post("/v1/admin/tenants/bob/keys")).json()
        assert second["owner"] == "bob" and second["apiKey"] != first["apiKey"]
        assert (await admin.post("/v1/admin/tenants/nobody/keys")).status_code == 404

        async with stack.http(first["apiKey"]) as one, stack.http(second["apiKey"]) as two:
            assert (await one.get("/v1/environments")).status_code == 200  # cached by the API server now
            assert (await two.get("/v1/environments")).status_code == 200
            revoked = await admin.delete(f"/v1/admin/tenants/bob/keys/{first['keyId']}")
            assert revoked.status_code == 200
            assert [k["id"] for k in revoked.json()["keys"]] == [second["keyId"]]
            assert (await one.get("/v1/environments")).status_code == 401  # at once, despite the cache
            assert (await two.get("/v1/environments")).status_code == 200
            again = await admin.delete(f"/v1/admin/tenants/bob/keys/{first['keyId']}")
            assert again.status_code == 404

            rotated = await admin.post(f"/v1/admin/tenants/bob/keys/{second['keyId']}/rotate")
            assert rotated.status_code == 200, rotated.text
            new = rotated.json()
            assert new["apiKey"] not in (first["apiKey"], second["apiKey"])
            assert (await two.get("/v1/environments")).status_code == 401
            async with stack.http(new["apiKey"]) as three:
                assert (await three.get("/v1/environments")).status_code == 200
        bad = await admin.delete("/v1/admin/tenants/bob/keys/nonsense")
        assert bad.status_code == 422 and bad.json()["error"]["details"]["field"] == "keyId"


async def test_nodes_list_cordon_uncordon_and_cluster_status(api_stack) -> None:
    stack: ApiStack = await api_stack()
    await stack.register_node("n1", cpu_millis=4000, memory_bytes=8 * 2**30)
    await stack.register_node("n2", cpu_millis=2000, memory_bytes=4 * 2**30)
    user_key = await stack.tenant("carol")
    async with stack.http(await admin_key(stack)) as admin, stack.http(user_key) as user:
        made = await user.post("/v1/environments", json={"resources": {"cpuMillis": 1000, "memoryBytes": 2**30}})
        assert made.status_code == 201, made.text
        placed = made.json()["node"]
        nodes = {n["name"]: n for n in (await admin.get("/v1/admin/nodes")).json()}
        assert set(nodes) == {"n1", "n2"}
        n = nodes[placed]
        assert n["health"] == "ready" and n["admissionOpen"] is True and n["cordoned"] is False
        assert n["reserved"]["cpuMillis"] == 1000
        assert n["allocatable"]["cpuMillis"] == n["capacity"]["cpuMillis"] - 1000
        assert n["environments"] == {"pending": 1}
        assert 0 < time.time() - n["lastHeartbeatAt"] < 10

        cordoned = await admin.post("/v1/admin/nodes/n1/cordon")
        assert cordoned.status_code == 200
        assert cordoned.json()["cordoned"] is True and cordoned.json()["admissionOpen"] is False
        # A capacity report of the node does not reopen it.
        node = next(h for h in stack.nodes if h.name == "n1")
        await node.stub.ReportCapacity(
            pb.ReportCapacityRequest(
                node="n1",
                session=node.session,
                capacity_json=json.dumps({"cpuMillis": 4000, "memoryBytes": 8 * 2**30, "diskBytes": 2**40}),
                valid_for_seconds=600,
                admission_open=True,
            )
        )
        listed = {n["name"]: n for n in (await admin.get("/v1/admin/nodes")).json()}
        assert listed["n1"]["admissionOpen"] is False and listed["n1"]["admissionReason"] == "cordoned by an admin"
        for _ in range(3):
            placed_now = await user.post("/v1/environments", json=SMALL)
            assert placed_now.status_code == 201 and placed_now.json()["node"] == "n2"
        # Cordoning every node leaves no room: the refusal says why.
        await admin.post("/v1/admin/nodes/n2/cordon")
        refused = await user.post("/v1/environments", json=SMALL)
        assert refused.status_code == 503 and "cordoned by an admin" in refused.text
        await admin.post("/v1/admin/nodes/n2/uncordon")
        back = (await admin.post("/v1/admin/nodes/n1/uncordon")).json()
        assert back["cordoned"] is False and back["admissionOpen"] is True and back["admissionReason"] == ""
        assert (await admin.post("/v1/admin/nodes/n9/cordon")).status_code == 404

        status = (await admin.get("/v1/admin/cluster")).json()
        assert [n["name"] for n in status["nodes"]] == ["n1", "n2"]
        assert status["environments"] == {"pending": 4}
        assert "replica" in status["leader"]


async def test_admin_routes_are_in_the_openapi_schema(api_stack) -> None:
    stack: ApiStack = await api_stack()
    async with httpx.AsyncClient(base_url=stack.url) as client:
        schema = (await client.get("/openapi.json")).json()
    paths = schema["paths"]
    for path in ("/v1/admin/tenants", "/v1/admin/nodes", "/v1/admin/cluster", "/v1/admin/nodes/{node}/drain"):
        assert path in paths
    body = paths["/v1/admin/tenants"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("CreateTenantBody")
    assert "AdminKey" in schema["components"]["securitySchemes"]
    drain = paths["/v1/admin/nodes/{node}/drain"]["post"]["responses"]["200"]["content"]["application/x-ndjson"]
    assert "$ref" not in json.dumps(drain) and "cordoned" in drain["schema"]["properties"]["step"]["enum"]
    await asyncio.sleep(0)
