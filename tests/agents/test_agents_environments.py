"""``ctx.environment(...)``: ADX Environments from graph nodes, on a real stack.

Real PostgreSQL, real ``adx agent worker`` processes (SIGKILLed), and a real Coordinator (on Redis), adxlet,
sandboxd and API server that the workers reach over HTTP with a tenant API key from their config. The graph is
``sandbox`` of agents_envapp.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import agents_envapp
import pytest
import redis.asyncio as aioredis
from agents_helpers import TENANT, fetch, make_scheduler, standard_schemas
from agents_workers import kill, start_worker, stop, tail, wait_started
from apistack import ApiStack, api_for  # noqa: F401  (fixtures)

import adx
from adx.agents import (
    AgentRuns,
    AgentStore,
    DurableGraphDriverOptions,
    EnvironmentAccess,
    ExecutableGraphRegistry,
    ExecutableGraphRegistryBuilder,
    RunStatus,
)
from adx.agents._config import AgentWorkerConfig
from adx.config._base import ConfigError, load_model
from adx.errors import UncertainOutcomeError

STEP = 60.0


def registry() -> ExecutableGraphRegistry:
    schemas = standard_schemas()
    agents_envapp.register_schemas(schemas)
    executables = ExecutableGraphRegistryBuilder(schemas.build())
    agents_envapp.register_graphs(executables)
    return executables.build()


async def environment_stack(store: AgentStore, node_cluster: Any, make_api: Any) -> tuple[ApiStack, str, AgentRuns]:
    """A Coordinator, one real adxlet + sandboxd and the API server; the agent tenant's API key; run access."""
    nc = await node_cluster()
    stack: ApiStack = await make_api(nc.cluster)
    return stack, await stack.tenant(TENANT), AgentRuns(store, registry())


async def tick_until(scheduler: Any, runs: AgentRuns, run_id: uuid.UUID, *statuses: RunStatus) -> RunStatus:
    """Drive the run with an in-process scheduler (one tick at a time) until it has one of ``statuses``."""
    deadline = time.monotonic() + STEP
    while (status := (await runs.get_run(TENANT, run_id)).status) not in statuses:
        assert time.monotonic() < deadline, f"the run is {status}, not {statuses}"
        await scheduler.tick()
        await asyncio.sleep(0.05)
    return status


def worker_config(path: Path, dsn: str, api_url: str, api_key: str) -> Path:
    path.write_text(
        f'database_url = "{dsn}"\ntenant_id = "{TENANT}"\nregistrations = "agents_envapp"\n'
        "slots = 2\nidle_poll_seconds = 0.05\ndrain_seconds = 5\nmax_node_attempts = 20\n"
        f'[environments]\napi_url = "{api_url}"\napi_key = "{api_key}"\n'
    )
    return path


async def until(what: str, check: Callable[[], Any], within: float = STEP, log: Path | None = None) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {within}s; worker log: {tail(log) if log else ''}"
        await asyncio.sleep(0.05)


async def run_environments(client: adx.AsyncClient, run_id: uuid.UUID) -> list[adx.AsyncEnvironment]:
    """The live Environments the API lists for the run (by the label the runtime sets)."""
    return [e for e in await client.environments.list() if e.metadata.get("adx-agent-run") == str(run_id)]


async def environment_rows(store: AgentStore, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return await fetch(store, "SELECT * FROM adx_agent_environments WHERE run_id = %s ORDER BY name", run_id)


@pytest.mark.slow
@pytest.mark.req("AGT-16", "AGT-17")
async def test_sigkill_after_the_create_reattaches_to_the_same_environment(
    store: AgentStore,
    postgres_dsn: str,
    node_cluster: Any,
    api_for: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A node creates an Environment and writes a file; its worker is SIGKILLed before that node commits, and the
    next owner's worker is SIGKILLed in the next node: each new owner reattaches to the same Environment (the
    file is there, exactly one Environment exists for the run), the run completes, the Environment is deleted."""
    stack, key, runs = await environment_stack(store, node_cluster, api_for)
    holds = tmp_path / "holds"
    holds.mkdir()
    (holds / "make").touch()
    (holds / "check").touch()
    trace = tmp_path / "nodes.log"
    env = {"AGENTS_ENV_HOLD_DIR": str(holds), "AGENTS_ENV_LOG": str(trace)}
    config = worker_config(tmp_path / "worker.toml", postgres_dsn, stack.url, key)
    log = tmp_path / "worker.log"
    run_id = (await runs.submit(TENANT, "sandbox", "1", {})).run_id

    async with adx.AsyncClient(stack.url, key) as client:
        first = start_worker(config, postgres_dsn, log, **env)
        await wait_started(first, log, 0)
        await until("make reached its hold", (holds / "make.reached").exists, log=log)
        # After the create (and the write), before the node committed: the ID is already recorded.
        [row] = await environment_rows(store, run_id)
        assert row["status"] == "active" and row["environment_id"], row
        env_id = row["environment_id"]
        assert (await (await client.environments.get(env_id)).files.read(agents_envapp.NOTE)).decode() == (
            f"made by {run_id}\n"
        )
        await kill(first)
        (holds / "make").unlink()

        second = start_worker(config, postgres_dsn, log, **env)
        await wait_started(second, log, 1)
        await until("check reached its hold", (holds / "check.reached").exists, log=log)
        assert (await runs.get_run(TENANT, run_id)).checkpoint_seq == 1  # make committed, check runs
        await kill(second)
        (holds / "check").unlink()

        third = start_worker(config, postgres_dsn, log, **env)
        await wait_started(third, log, 2)
        result = await runs.wait(TENANT, run_id, timeout=STEP)
        assert await stop(third) == 0

        assert result.status == RunStatus.SUCCEEDED, result.failure
        out = result.artifact
        # make ran twice (killed once); the second execution found the first one's file in the same Environment.
        assert out["env_id"] == out["check_env_id"] == env_id
        assert out["found_before"] == f"made by {run_id}"
        assert out["note"] == out["cat"] == f"made by {run_id}\n"
        makes = [line for line in trace.read_text().splitlines() if line.startswith("make ")]
        assert len(makes) == 2 and all(f"env={env_id}" in line for line in makes), makes
        assert "before='absent'" in makes[0] and f"before='made by {run_id}'" in makes[1]

        # Exactly one Environment was ever created for the run (the Coordinator's records, deleted ones
        # included), and the run's end deleted it.
        records = await stack.cluster.coordinator.store.load_all_environments()
        assert [(r.id, r.spec.metadata["adx-agent-run"]) for r in records] == [(env_id, str(run_id))]
        assert (await client.environments.get(env_id)).state in ("deleting", "deleted")
        assert await run_environments(client, run_id) == []  # the list shows live Environments only
    [row] = await environment_rows(store, run_id)
    assert (row["status"], row["environment_id"], row["generation"]) == ("deleted", env_id, 1)


@pytest.mark.slow
@pytest.mark.req("AGT-5")
async def test_a_waiting_runs_environment_is_paused_and_resumed_on_use(
    store: AgentStore,
    postgres_dsn: str,
    node_cluster: Any,
    api_for: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """While the run waits for an approval its Environment is paused (the file kept); the node after the wait
    resumes it by using it; at the end it is deleted, while an Environment created with keep=True stays."""
    stack, key, runs = await environment_stack(store, node_cluster, api_for)
    config = worker_config(tmp_path / "worker.toml", postgres_dsn, stack.url, key)
    log = tmp_path / "worker.log"
    run_id = (await runs.submit(TENANT, "sandbox", "1", {"wait": True, "keep_spare": True})).run_id
    worker = start_worker(config, postgres_dsn, log, AGENTS_ENV_LOG=str(tmp_path / "nodes.log"))
    try:
        await wait_started(worker, log, 0)
        async with adx.AsyncClient(stack.url, key) as client:

            async def waiting() -> bool:
                return (await runs.get_run(TENANT, run_id)).status == RunStatus.WAITING

            await until("the run waits", waiting, log=log)
            rows = {r["name"]: r for r in await environment_rows(store, run_id)}
            assert set(rows) == {"box", "spare"} and {r["status"] for r in rows.values()} == {"paused"}, rows
            box = await client.environments.get(rows["box"]["environment_id"])
            spare = await client.environments.get(rows["spare"]["environment_id"])
            # Paused before the wait committed: nothing is left running while the run waits.
            assert (box.state, spare.state) == ("paused", "paused")

            await runs.resolve(TENANT, run_id, "approve", {"by": "ann"})
            result = await runs.wait(TENANT, run_id, timeout=STEP)
            assert result.status == RunStatus.SUCCEEDED, result.failure
            assert result.artifact["after_env_id"] == box.id
            assert result.artifact["after_cat"] == f"made by {run_id}\n"  # resumed with its file

            assert (await box.refresh()).state in ("deleting", "deleted")
            # keep=True: left to the application, as it was when the run ended (paused by the wait).
            assert (await spare.refresh()).state == "paused"
            assert [e.id for e in await run_environments(client, run_id)] == [spare.id]
            rows = {r["name"]: r for r in await environment_rows(store, run_id)}
            assert (rows["box"]["status"], rows["spare"]["status"]) == ("deleted", "paused")
            await spare.delete()
    finally:
        assert await stop(worker) == 0, tail(log)


@pytest.mark.slow
@pytest.mark.req("AGT-16")
async def test_a_create_with_an_unknown_outcome_is_found_again_even_after_the_api_forgot_its_key(
    store: AgentStore,
    node_cluster: Any,
    api_for: Any,  # noqa: F811
) -> None:
    """The owner's create reached the API, then recording the Environment's ID failed (the database connection
    broke: the outcome is unknown to the runtime). The API's record of the create's Idempotency-Key is then
    removed from Redis, as after its 24 h retention. The next owner finds the Environment by its label and
    records it: one Environment for the run, the run completes on it."""
    stack, key, runs = await environment_stack(store, node_cluster, api_for)
    run_id = (await runs.submit(TENANT, "sandbox", "1", {})).run_id
    options = DurableGraphDriverOptions(
        lease_seconds=5.0, retry_backoff_seconds=0.05, environments=EnvironmentAccess(stack.url, key)
    )
    scheduler = make_scheduler(store, runs.executables, driver=options)
    broker = scheduler.loop.driver.environments
    assert broker is not None
    record = broker._rows.update

    async def lost(*args: Any, **kwargs: Any) -> None:
        raise UncertainOutcomeError("record environment: database connection failed")

    broker._rows.update = lost  # type: ignore[method-assign]
    try:
        assert (await scheduler.tick()).outcome is not None
        [row] = await environment_rows(store, run_id)
        assert (row["status"], row["environment_id"]) == ("creating", None)  # created, but not recorded
        [created] = await stack.cluster.coordinator.store.load_all_environments()
        assert created.spec.metadata["adx-agent-key"] == row["idempotency_key"]
        redis = aioredis.from_url(stack.cluster.redis.read_info().url)
        try:
            forgotten = [k async for k in redis.scan_iter(match="adx:idem:*")]
            assert len(forgotten) == 1
            await redis.delete(*forgotten)
        finally:
            await redis.aclose()

        broker._rows.update = record  # type: ignore[method-assign]
        await tick_until(scheduler, runs, run_id, RunStatus.SUCCEEDED, RunStatus.FAILED)
        result = await runs.wait(TENANT, run_id, timeout=STEP)
        assert result.status == RunStatus.SUCCEEDED, result.failure
        assert result.artifact["env_id"] == result.artifact["check_env_id"] == created.id
        assert [r.id for r in await stack.cluster.coordinator.store.load_all_environments()] == [created.id]
        [row] = await environment_rows(store, run_id)
        assert (row["status"], row["environment_id"], row["generation"]) == ("deleted", created.id, 1)
    finally:
        await broker.close()


def test_the_worker_config_names_the_api_and_its_key(tmp_path: Path) -> None:
    """[environments] is typed: the key may come from the override, is never shown, and bad input names its field."""
    base = 'database_url = "postgresql://adx@127.0.0.1/adx"\nregistrations = "agents_envapp"\n[environments]\n'
    path = tmp_path / "worker.toml"
    path.write_text(base + 'api_url = "http://127.0.0.1:8080/"\n')
    cfg = load_model(AgentWorkerConfig, "agent-worker", path, {"ADX_AGENT_WORKER__ENVIRONMENTS__API_KEY": "s3cret"})
    assert cfg.environments is not None and cfg.environments.api_url == "http://127.0.0.1:8080"
    assert cfg.environments.api_key.get_secret_value() == "s3cret" and "s3cret" not in repr(cfg)
    assert (cfg.environments.timeout_seconds, cfg.environments.ready_timeout_seconds) == (30.0, 120.0)
    with pytest.raises(ConfigError, match=r"environments\.api_key"):
        load_model(AgentWorkerConfig, "agent-worker", path, {})
    path.write_text(base + 'api_url = "127.0.0.1:8080"\napi_key = "k"\n')
    with pytest.raises(ConfigError, match=r"environments\.api_url.*http://"):
        load_model(AgentWorkerConfig, "agent-worker", path, {})
    # One API key is one ADX tenant: not offered to a worker that ticks several tenants.
    path.write_text(
        base.replace("[environments]", '[fairness]\npolicy = "p"\nweights = { acme = 1 }\n[environments]')
        + 'api_url = "http://127.0.0.1:8080"\napi_key = "k"\n'
    )
    with pytest.raises(ConfigError, match="cannot be combined with fairness"):
        load_model(AgentWorkerConfig, "agent-worker", path, {})


async def test_a_node_asking_for_an_environment_where_no_api_is_configured_fails_naming_the_field(
    store: AgentStore,
) -> None:
    runs = AgentRuns(store, registry())
    run_id = (await runs.submit(TENANT, "sandbox", "1", {})).run_id
    options = DurableGraphDriverOptions(lease_seconds=5.0, retry_backoff_seconds=0.01, max_node_attempts=2)
    scheduler = make_scheduler(store, runs.executables, driver=options)
    assert await tick_until(scheduler, runs, run_id, RunStatus.SUCCEEDED, RunStatus.FAILED) == RunStatus.FAILED
    result = await runs.wait(TENANT, run_id, timeout=STEP)
    assert result.status == RunStatus.FAILED
    assert "environments: this worker has no ADX API configured" in str(result.failure), result.failure
    assert await environment_rows(store, run_id) == []


@pytest.mark.slow
@pytest.mark.req("AGT-5")
async def test_an_environment_deleted_behind_the_runs_back_is_replaced_by_a_new_generation(
    store: AgentStore,
    node_cluster: Any,
    api_for: Any,  # noqa: F811
) -> None:
    """While the run waits, someone deletes its Environment; the node after the wait gets a new one (the next
    generation, a new idempotency key), which the run's end deletes in turn."""
    stack, key, runs = await environment_stack(store, node_cluster, api_for)
    run_id = (await runs.submit(TENANT, "sandbox", "1", {"wait": True})).run_id
    options = DurableGraphDriverOptions(
        lease_seconds=5.0, retry_backoff_seconds=0.05, environments=EnvironmentAccess(stack.url, key)
    )
    scheduler = make_scheduler(store, runs.executables, driver=options)
    assert scheduler.loop.driver.environments is not None

    try:
        await tick_until(scheduler, runs, run_id, RunStatus.WAITING)
        [first] = await environment_rows(store, run_id)
        assert (first["status"], first["generation"]) == ("paused", 1)
        async with adx.AsyncClient(stack.url, key) as client:
            await client.environments.delete(first["environment_id"])
            await runs.resolve(TENANT, run_id, "approve", {"by": "ann"})
            await tick_until(scheduler, runs, run_id, RunStatus.SUCCEEDED)
            result = await runs.wait(TENANT, run_id, timeout=STEP)
            [second] = await environment_rows(store, run_id)
            assert result.artifact["after_env_id"] == second["environment_id"] != first["environment_id"]
            assert result.artifact["after_cat"] == ""  # a new Environment: the old one's file is gone with it
            assert (second["status"], second["generation"]) == ("deleted", 2)
            assert second["idempotency_key"] == f"agent-env/{TENANT}/{run_id}/box/2"
            assert (await client.environments.get(second["environment_id"])).state in ("deleting", "deleted")
    finally:
        await scheduler.loop.driver.environments.close()
