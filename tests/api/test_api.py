"""The REST API server on real parts: uvicorn on a free port, the real Coordinator on a real Redis."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import pytest
from apistack import ApiStack, GiB

from adx.model import new_id

SPEC: dict[str, Any] = {"resources": {"cpuMillis": 500, "memoryBytes": 256 * 2**20}}


async def env_count(stack: ApiStack) -> int:
    """Environments stored in the Coordinator's Redis (the authority), whatever the tenant."""
    return len(await stack.cluster.coordinator.store.load_all_environments())


@pytest.mark.req("ENV-1")
async def test_create_get_list_delete_over_http(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    async with stack.http(key) as http:
        body = {
            **SPEC,
            "entrypoint": ["sleep", "1000"],
            "env": {"A": "secret"},
            "metadata": {"team": "x"},
            "lifecycle": {"idleTimeoutSeconds": 60, "restartPolicy": {"maxRetries": 2}},
        }
        created = await http.post("/v1/environments", json=body)
        assert created.status_code == 201, created.text
        env = created.json()
        assert created.headers["location"] == f"/v1/environments/{env['id']}"
        assert env["state"] == "pending" and env["node"] == "n1"
        assert env["resources"] == {"cpuMillis": 500, "memoryBytes": 256 * 2**20, "diskBytes": 0}
        assert env["lifecycle"]["idleTimeoutSeconds"] == 60
        assert env["lifecycle"]["restartPolicy"]["maxRetries"] == 2
        assert env["metadata"] == {"team": "x"} and env["entrypoint"] == ["sleep", "1000"]
        assert {"executionId", "createdAt", "restartAttempts", "restartPending", "checkpoint"} <= set(env)
        assert "tenant" not in env and "env" not in env  # neither internal fields nor env values are echoed

        got = await http.get(f"/v1/environments/{env['id']}")
        assert got.status_code == 200 and got.json()["id"] == env["id"]
        listed = (await http.get("/v1/environments")).json()["environments"]
        assert [e["id"] for e in listed] == [env["id"]]

        deleted = await http.delete(f"/v1/environments/{env['id']}")
        assert deleted.status_code == 200 and deleted.json()["state"] in ("deleting", "deleted")
        again = await http.delete(f"/v1/environments/{env['id']}")
        assert again.status_code == 200  # repeating a delete is harmless


@pytest.mark.req("ENV-5", "ENV-2")
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"resources": {"cpuMillis": -500, "memoryBytes": GiB}}, "resources.cpuMillis"),
        ({"resources": {"cpuMillis": 0, "memoryBytes": GiB}}, "resources.cpuMillis"),
        ({"resources": {"cpuMillis": 2**70, "memoryBytes": GiB}}, "resources.cpuMillis"),
        ({"resources": {"cpuMillis": 500, "memoryBytes": "lots"}}, "resources.memoryBytes"),
        ({"resources": {"cpuMillis": 500, "memoryBytes": -1}}, "resources.memoryBytes"),
        ({"lifecycle": {"idleAction": "sleep"}}, "lifecycle.idleAction"),
        ({"lifecycle": {"idleAction": "pause"}}, "lifecycle"),
        ({"lifecycle": {"pauseOptions": {"timeoutSeconds": 0}}}, "lifecycle.pauseOptions.timeoutSeconds"),
        ({"resourcez": {}}, "resourcez"),
    ],
)
async def test_bad_specs_are_422_naming_the_field_and_create_nothing(api_stack, change, field) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    async with stack.http(key) as http:
        response = await http.post("/v1/environments", json={**SPEC, **change})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_input"
        assert error["details"]["field"] == field, error
        assert error["message"].startswith(field)
        assert (await http.get("/v1/environments")).json()["environments"] == []
    assert await env_count(stack) == 0


@pytest.mark.req("ENV-5")
async def test_malformed_bodies_and_keys_are_422(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    async with stack.http(key) as http:
        for content in (b"{not json", b"", b"[1, 2]"):
            response = await http.post("/v1/environments", content=content)
            assert response.status_code == 422, response.text
            assert response.json()["error"]["details"]["field"] in ("body", ""), response.text
        response = await http.post("/v1/environments", json=SPEC, headers={"Idempotency-Key": "x" * 300})
        assert response.status_code == 422 and response.json()["error"]["details"]["field"] == "Idempotency-Key"
    assert await env_count(stack) == 0


async def test_unknown_or_missing_keys_are_401(api_stack) -> None:
    stack: ApiStack = await api_stack()
    for key in (None, "adx_not-a-key"):
        async with stack.http(key) as http:
            for method, path in (("GET", "/v1/environments"), ("POST", "/v1/environments")):
                response = await http.request(method, path, json=SPEC)
                assert response.status_code == 401, response.text
                assert response.json()["error"]["code"] == "unauthenticated"
                assert response.headers["www-authenticate"] == "Bearer"
    async with httpx.AsyncClient(base_url=stack.url, headers={"Authorization": "Basic abc"}) as http:
        assert (await http.get("/v1/environments")).status_code == 401


@pytest.mark.req("SEC-2")
async def test_another_tenants_environment_is_a_404_like_a_missing_one(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key_a, key_b = await stack.tenant("alpha"), await stack.tenant("beta")
    await stack.register_node("n1")
    async with stack.http(key_a) as a, stack.http(key_b) as b:
        env = (await a.post("/v1/environments", json=SPEC)).json()
        missing = new_id("env")
        for method in ("GET", "DELETE"):
            foreign = await b.request(method, f"/v1/environments/{env['id']}")
            absent = await b.request(method, f"/v1/environments/{missing}")
            assert foreign.status_code == absent.status_code == 404
            # Same body apart from the ID the caller sent itself.
            assert foreign.json() == {
                "error": {"code": "not_found", "message": f"environment {env['id']} not found", "details": {}}
            }
            assert absent.json()["error"]["message"] == f"environment {missing} not found"
        assert (await b.get("/v1/environments")).json()["environments"] == []
        assert (await b.post(f"/v1/environments/{env['id']}/pause")).status_code == 404

        # Timing class: the foreign and the missing case take the same path (one Redis read). Samples are
        # interleaved so machine load hits both alike.
        foreign_s: list[float] = []
        absent_s: list[float] = []
        for _ in range(25):
            for path, samples in (
                (f"/v1/environments/{env['id']}", foreign_s),
                (f"/v1/environments/{missing}", absent_s),
            ):
                start = time.perf_counter()
                assert (await b.get(path)).status_code == 404
                samples.append(time.perf_counter() - start)
        foreign_t, absent_t = statistics.median(foreign_s), statistics.median(absent_s)
        assert abs(foreign_t - absent_t) < max(0.005, 0.5 * min(foreign_t, absent_t)), (foreign_t, absent_t)
        # A's Environment is untouched by B's delete attempts.
        assert (await a.get(f"/v1/environments/{env['id']}")).json()["state"] == "pending"


async def test_idempotency_key_returns_the_same_environment(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key_a, key_b = await stack.tenant("alpha"), await stack.tenant("beta")
    await stack.register_node("n1")
    async with stack.http(key_a) as a, stack.http(key_b) as b:
        first = await a.post("/v1/environments", json=SPEC, headers={"Idempotency-Key": "k-1"})
        second = await a.post("/v1/environments", json=SPEC, headers={"Idempotency-Key": "k-1"})
        assert (first.status_code, second.status_code) == (201, 200)
        assert first.json()["id"] == second.json()["id"]
        assert second.headers["idempotent-replayed"] == "true"
        other = await b.post("/v1/environments", json=SPEC, headers={"Idempotency-Key": "k-1"})
        assert other.status_code == 201 and other.json()["id"] != first.json()["id"]  # keys are per tenant
    assert await env_count(stack) == 2


async def test_no_capacity_and_coordinator_down_are_503(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    async with stack.http(key) as http:
        response = await http.post("/v1/environments", json=SPEC)  # no node registered
        assert response.status_code == 503 and response.json()["error"]["code"] == "no_capacity"
        await stack.register_node("small", cpu_millis=100, memory_bytes=GiB)
        response = await http.post("/v1/environments", json=SPEC)
        assert response.status_code == 503 and response.json()["error"]["code"] == "no_capacity"
        assert "small" in response.json()["error"]["message"]

        await stack.cluster.coordinator.stop(grace=None)
        response = await http.get("/v1/environments")
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "unavailable"
        assert response.headers["retry-after"] == "1"


async def test_pause_and_resume_of_an_environment_that_is_not_running_are_409(api_stack) -> None:
    """Pause needs a running Environment, resume a paused (or running) one; a pending one is neither."""
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    async with stack.http(key) as http:
        env = (await http.post("/v1/environments", json=SPEC)).json()
        response = await http.post(f"/v1/environments/{env['id']}/pause")
        assert response.status_code == 409 and "only a running Environment can be paused" in response.text
        response = await http.post(f"/v1/environments/{env['id']}/lifetime", json={"seconds": 0})
        assert response.status_code == 422 and response.json()["error"]["details"]["field"] == "seconds"
        response = await http.post(f"/v1/environments/{env['id']}/lifetime", json={"seconds": 60, "action": "x"})
        assert response.status_code == 422 and response.json()["error"]["details"]["field"] == "action"
        response = await http.post(f"/v1/environments/{env['id']}/lifetime", json={"seconds": 60})
        assert response.status_code == 200 and response.json()["expiresAt"] > time.time() + 50


async def test_openapi_is_served_with_the_camelcase_contract(api_stack) -> None:
    stack: ApiStack = await api_stack()
    async with httpx.AsyncClient(base_url=stack.url) as http:
        schema = (await http.get("/openapi.json")).json()
    paths = schema["paths"]
    assert {"post", "get"} <= set(paths["/v1/environments"])
    assert {"get", "delete"} <= set(paths["/v1/environments/{environment_id}"])
    assert "post" in paths["/v1/environments/{environment_id}/commands"]
    assert {"get", "put", "delete"} <= set(paths["/v1/environments/{environment_id}/files"])
    components = schema["components"]["schemas"]
    assert {"cpuMillis", "memoryBytes", "diskBytes"} <= set(components["Resources"]["properties"])
    assert {"resources", "entrypoint", "env", "metadata", "lifecycle"} <= set(
        components["EnvironmentSpec"]["properties"]
    )
    assert {"idleTimeoutSeconds", "idleAction", "pauseOptions", "restartPolicy"} <= set(
        components["Lifecycle"]["properties"]
    )
    view = components["EnvironmentView"]["properties"]
    assert {"id", "state", "node", "executionId", "createdAt", "restartAttempts", "restartPending"} <= set(view)
    assert "bearer" in str(schema["components"]["securitySchemes"]).lower()


async def test_twenty_concurrent_creates_all_succeed(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1", cpu_millis=20 * 500, memory_bytes=20 * 256 * 2**20)
    async with stack.http(key) as http:
        responses = await asyncio.gather(*(http.post("/v1/environments", json=SPEC) for _ in range(20)))
        assert [r.status_code for r in responses] == [201] * 20, [r.text for r in responses if r.status_code != 201]
        ids = {r.json()["id"] for r in responses}
        assert len(ids) == 20
        # The node is now exactly full: the 21st is refused (placement reserved every one of the 20).
        extra = await http.post("/v1/environments", json=SPEC)
        assert extra.status_code == 503 and extra.json()["error"]["code"] == "no_capacity"
        assert {e["id"] for e in (await http.get("/v1/environments")).json()["environments"]} == ids


def test_ingress_alone_serves_only_the_data_plane(tmp_path) -> None:
    from adx.api import ApiConfig, create_app

    def routes(app: Any) -> set[tuple[str, str]]:
        return {(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item}

    config = ApiConfig(certs_dir=tmp_path)
    alone = routes(create_app(config, api=False, ingress=True))
    assert ("POST", "/v1/environments/{environment_id}/commands") in alone
    assert ("PUT", "/v1/environments/{environment_id}/files") in alone
    assert ("POST", "/v1/environments") not in alone
    both = routes(create_app(config))
    assert {("POST", "/v1/environments"), ("POST", "/v1/environments/{environment_id}/commands")} <= both
    api_only = routes(create_app(config.model_copy(update={"ingress": False})))
    assert ("POST", "/v1/environments/{environment_id}/commands") not in api_only


async def test_405_names_every_method_the_path_allows(api_stack) -> None:
    """The schema fuzzer saw 405 answers with a wrong ``Allow`` header: the router answered with the methods of
    the first route matching the path only (GET /v1/environments/{id} and DELETE on the same path are two
    routes). The header lists every method of every route of that path."""
    stack: ApiStack = await api_stack()
    key = await stack.tenant("alpha")
    async with stack.http(key) as http:
        response = await http.request("PUT", f"/v1/environments/{new_id('env')}")
        assert response.status_code == 405
        assert response.json()["error"]["code"] == "method_not_allowed"
        allowed = {method.strip() for method in response.headers["allow"].split(",")}
        assert {"GET", "DELETE"} <= allowed and "PUT" not in allowed

        response = await http.request("PATCH", "/v1/environments")
        assert response.status_code == 405
        allowed = {method.strip() for method in response.headers["allow"].split(",")}
        assert {"GET", "POST"} <= allowed and "PATCH" not in allowed
