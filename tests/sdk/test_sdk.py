"""The Python SDK against the real API server, Coordinator and Redis (sync and async twins)."""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apistack import ApiStack, free_port

import adx
from adx.sdk import credentials_path, write_credentials

SDK_DIR = Path(adx.__file__).parent / "sdk"


def test_public_exports_are_honest() -> None:
    """`adx` exports exactly the SDK names ARCHITECTURE.md shows, each resolvable; the SDK imports only
    adx.model, adx.errors, adx._backoff (standard library only), httpx and the standard library."""
    for name in ["Client", "AsyncClient", "IdleAction", "PausePolicy", "Retention", "CheckpointStorage"]:
        assert name in adx.__all__
    assert "RestartPolicy" in adx.__all__ and "AdxError" in adx.__all__
    for name in adx.__all__:
        assert getattr(adx, name) is not None, name
    assert set(adx.__all__) <= set(dir(adx))
    with pytest.raises(AttributeError):
        _ = adx.NoSuchThing  # type: ignore[attr-defined]
    for error in ("InvalidInputError", "NotFoundError", "ConflictError", "UnavailableError", "UncertainOutcomeError"):
        assert issubclass(getattr(adx, error), adx.AdxError)
    assert issubclass(adx.WaitTimeoutError, adx.errors.AdxError)

    allowed = {"adx.model", "adx.errors", "adx._backoff", "httpx"}
    for path in SDK_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            for module in modules:
                top = module.split(".")[0]
                ok = module in allowed or module.startswith("adx.sdk") or top in sys.stdlib_module_names
                ok = ok or module == "__future__" or top == "httpx"
                assert ok, f"{path.name} imports {module}"

    # `import adx` stays light (every daemon imports the package); using the SDK loads no server code.
    code = (
        "import sys, adx; light = 'httpx' not in sys.modules and 'pydantic' not in sys.modules; adx.Client; "
        "print(light, sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'fastapi', 'uvicorn') "
        "or m.startswith(('adx.api', 'adx.coordinator', 'adx.node', 'adx.ingress'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "True []", out.stdout


@pytest.mark.req("ENV-1", "ENV-3")
def test_architecture_snippet_objects_and_input_errors() -> None:
    pause = adx.PausePolicy(retention=adx.Retention.ttl(3600), storage=adx.CheckpointStorage.LOCAL)
    assert pause.retention.ttl_seconds == 3600 and pause.storage == "local"
    assert adx.RestartPolicy(max_retries=3).max_retries == 3
    assert adx.Retention.forever().kind == "forever"
    with pytest.raises(adx.InvalidInputError) as caught:
        adx.RestartPolicy(max_retries=-1)
    assert caught.value.field == "restart.maxRetries"
    with pytest.raises(adx.InvalidInputError) as caught:
        adx.PausePolicy(timeout_seconds=0)
    assert caught.value.field == "pause.timeoutSeconds"
    with pytest.raises(adx.InvalidInputError) as caught:
        adx.Retention.ttl(-5)
    assert caught.value.field.startswith("retention")
    assert adx.EnvironmentState.RUNNING == "running"


@pytest.mark.req("ENV-5", "ENV-1", "ENV-2")
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cpu": -1}, "cpu"),
        ({"cpu": 0}, "cpu"),
        ({"cpu": "fast"}, "cpu"),
        ({"memory": "lots"}, "memory"),
        ({"memory": -5}, "memory"),
        ({"memory": 2**80}, "memory"),
        ({"idle_action": "sleep"}, "idle_action"),
        ({"idle_action": "pause"}, "idle_action"),  # pause needs a positive idle_timeout (ENV-2)
        ({"idle_timeout": -1}, "idle_timeout"),
        ({"entrypoint": "python3 -m http.server"}, "entrypoint"),
        ({"env": {"1BAD": "x"}}, "env"),
    ],
)
def test_bad_input_is_refused_before_any_request(kwargs: dict[str, Any], field: str) -> None:
    # Nothing listens at this URL: an InvalidInputError (not UnavailableError) proves nothing was sent.
    url = f"http://127.0.0.1:{free_port()}"
    with adx.Client(api_url=url, api_key="k", retries=0) as client, pytest.raises(adx.InvalidInputError) as caught:
        client.environments.create(**{"cpu": 1, "memory": "512Mi", **kwargs})
    assert caught.value.field == field
    assert str(caught.value).startswith(field)


def test_a_misspelt_keyword_is_a_type_error_before_any_request() -> None:
    """The spec, command, terminal and log options are typed ``**kwargs`` (one declaration for both clients):
    a name they do not take is a TypeError naming it, as for named parameters, never silently dropped."""
    url = f"http://127.0.0.1:{free_port()}"
    with adx.Client(api_url=url, api_key="k", retries=0) as client:
        with pytest.raises(TypeError, match="create\\(\\) got an unexpected keyword argument 'cpus'"):
            client.environments.create(cpus=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="'wait_timout'"):
            client.environments.create(cpu=1, wait_timout=5)  # type: ignore[call-arg]
        env = adx.Environment.__new__(adx.Environment)
        env._client, env.id = client, "env-x"
        with pytest.raises(TypeError, match="logs\\(\\) got an unexpected keyword argument 'tial'"):
            env.logs(tial=5)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="pty\\(\\) got an unexpected keyword argument 'row'"):
            env.pty(row=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="build_spec\\(\\) got an unexpected keyword argument 'mem'"):
        adx.sdk.build_spec(cpu=1, mem="1Gi")  # type: ignore[call-arg]


async def test_sdk_create_get_list_delete_async_and_sync(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(
            cpu=0.5,
            memory="256Mi",
            entrypoint=["python3", "-m", "http.server", "8000"],
            idle_timeout=300,
            idle_action=adx.IdleAction.DELETE,
            restart=adx.RestartPolicy(max_retries=3),
            metadata={"team": "a"},
            wait=False,
        )
        assert env.state == "pending" and env.state is adx.EnvironmentState.PENDING
        assert env.node == "n1" and env.execution_id is None and env.restart_attempts == 0
        assert env.resources.cpu_millis == 500 and env.resources.memory_bytes == 256 * 2**20
        assert env.lifecycle.idle_timeout_seconds == 300 and env.lifecycle.restart_policy is not None
        assert env.checkpoint is None and env.restart_pending is False and env.created_at > 0
        same = await client.environments.get(env.id)
        assert same.id == env.id and same.metadata == {"team": "a"}
        assert [e.id for e in await client.environments.list()] == [env.id]
        assert (await env.refresh()).state == "pending"

    def sync_part() -> None:
        with adx.Client(api_url=stack.url, api_key=key) as client:
            again = client.environments.get(env.id)
            assert again.id == env.id and repr(again).startswith("Environment(")
            second = client.environments.create(cpu="250m", memory=128 * 2**20, wait=False)
            assert {e.id for e in client.environments.list()} == {env.id, second.id}
            assert second.delete().state in ("deleting", "deleted")
            with pytest.raises(adx.NotFoundError):
                client.environments.get("env-" + "a" * 26)

    await asyncio.to_thread(sync_part)
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        deleted = await (await client.environments.get(env.id)).delete()
        assert deleted.state in ("deleting", "deleted")


async def test_create_waits_until_running(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    node = await stack.register_node("n1")

    async def node_starts_it() -> None:
        # Plays the adxlet's part through the real node-facing RPCs: starting, then running.
        for _ in range(1000):  # bounded: at most ~10 s
            if stack.cluster.coordinator.service.cache.environments:
                break
            await asyncio.sleep(0.01)
        (env_id,) = stack.cluster.coordinator.service.cache.environments
        await asyncio.sleep(0.2)
        await stack.mark_running(node, env_id)

    starter = asyncio.create_task(node_starts_it())
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=1, memory="512Mi", wait_timeout=10)
        assert env.state == "running" and env.execution_id is not None
    await starter


async def test_waiting_fails_clearly_on_timeout_and_on_failure(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    node = await stack.register_node("n1")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        with pytest.raises(adx.WaitTimeoutError) as caught:
            await client.environments.create(cpu=1, memory="512Mi", wait_timeout=0.5)
        pending = caught.value.environment
        assert "still pending" in str(caught.value) and pending.id in str(caught.value)
        assert (await client.environments.get(pending.id)).state == "pending"  # it exists

        await stack.commit(node, pending.id, {"state": "failed", "lastError": "image missing"})
        with pytest.raises(adx.ConflictError) as failed:
            await pending.wait_until_running(5)
        assert failed.value.code == "environment_failed" and "image missing" in str(failed.value)


async def test_http_errors_become_adx_errors(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key_a, key_b = await stack.tenant("alpha"), await stack.tenant("beta")
    async with adx.AsyncClient(api_url=stack.url, api_key=key_a, retries=0) as a:
        with pytest.raises(adx.ConflictError) as no_capacity:
            await a.environments.create(wait=False)
        assert no_capacity.value.code == "no_capacity" and no_capacity.value.details["httpStatus"] == 503
        await stack.register_node("n1")
        env = await a.environments.create(wait=False)
    async with adx.AsyncClient(api_url=stack.url, api_key=key_b, retries=0) as b:
        with pytest.raises(adx.NotFoundError):
            await b.environments.get(env.id)
        with pytest.raises(adx.NotFoundError):
            await b.environments.delete(env.id)
    async with adx.AsyncClient(api_url=stack.url, api_key="adx_wrong", retries=0) as bad:
        with pytest.raises(adx.InvalidInputError) as unauthenticated:
            await bad.environments.list()
        assert unauthenticated.value.code == "unauthenticated"
    await stack.cluster.coordinator.stop(grace=None)
    async with adx.AsyncClient(api_url=stack.url, api_key=key_a, retries=1) as a:
        with pytest.raises(adx.UnavailableError):
            await a.environments.list()


def test_client_finds_its_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ADX_API_URL", raising=False)
    monkeypatch.delenv("ADX_API_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    with pytest.raises(adx.InvalidInputError) as missing:
        adx.Client()
    assert missing.value.field == "api_url" and "adx up" in str(missing.value)

    path = write_credentials("http://127.0.0.1:9/", "key-from-file")
    assert path == tmp_path / "xdg" / "adx" / "credentials.json" == credentials_path()
    assert json.loads(path.read_text()) == {"api_url": "http://127.0.0.1:9/", "api_key": "key-from-file"}
    assert path.stat().st_mode & 0o777 == 0o600
    with adx.Client() as client:
        assert client.api_url == "http://127.0.0.1:9"

    monkeypatch.setenv("ADX_API_URL", "http://127.0.0.1:10")
    monkeypatch.setenv("ADX_API_KEY", "key-from-env")
    with adx.Client() as client:
        assert client.api_url == "http://127.0.0.1:10"
        assert client._http.headers["authorization"] == "Bearer key-from-env"
    with adx.Client(api_url="http://h:1", api_key="explicit") as client:
        assert client.api_url == "http://h:1"
        assert client._http.headers["authorization"] == "Bearer explicit"


async def test_twenty_concurrent_sdk_creates_all_succeed(api_stack) -> None:
    stack: ApiStack = await api_stack()
    key = await stack.tenant("acme")
    await stack.register_node("n1", cpu_millis=20 * 250, memory_bytes=20 * 2**28)
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        created = await asyncio.gather(
            *(client.environments.create(cpu="250m", memory=2**28, wait=False) for _ in range(20))
        )
        assert len({env.id for env in created}) == 20 and all(env.state == "pending" for env in created)
        assert {env.id for env in await client.environments.list()} == {env.id for env in created}
    assert len(await stack.cluster.coordinator.store.load_all_environments()) == 20
