"""SIGKILL the PostgreSQL server under a running worker: the worker rides it out, every run finishes, and no
committed node effect is duplicated (uncertain commits are reconciled, never guessed) (AGT-17, AGT-9)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

import agents_testapp
import pytest
from agents_helpers import TENANT, build_registry, fetch, make_scheduler

from adx.agents import (
    AgentRuns,
    AgentStore,
    AgentWorker,
    AgentWorkerBinding,
    AgentWorkerOptions,
    AgentWorkerReadiness,
    DurableGraphDriverOptions,
)
from adx.embedded import EmbeddedPostgres


@pytest.mark.slow
@pytest.mark.req("AGT-17", "AGT-13")
async def test_worker_survives_a_postgres_sigkill_mid_run(postgres_factory: Callable[..., EmbeddedPostgres]) -> None:
    server = postgres_factory()
    info = server.read_info()
    assert info is not None
    store = await AgentStore.open(info.url, max_size=8, timeout=5.0, statement_timeout_ms=5000)
    try:
        await store.ensure_tenant(TENANT)
        async with store.connection("setup") as conn:
            await conn.execute(agents_testapp.EFFECTS_DDL)
        registry = build_registry()
        api = AgentRuns(store, registry)
        ids = [(await api.submit(TENANT, "chain", "1", {"count": 0, "delay_ms": 80})).run_id for _ in range(8)]
        scheduler = make_scheduler(
            store,
            registry,
            driver=DurableGraphDriverOptions(lease_seconds=2.0, max_node_attempts=50, retry_backoff_seconds=0.05),
        )

        async def db_ready() -> bool:
            await store.check_schema()
            return True

        worker = await AgentWorker.start(
            AgentWorkerBinding.tenant(scheduler),
            AgentWorkerReadiness(db_ready, interval_seconds=0.2, ttl_seconds=1.0, timeout_seconds=1.0),
            AgentWorkerOptions(slots=4, idle_poll_seconds=0.05, error_backoff_seconds=0.1),
        )
        try:
            await _until(lambda: _progress(store), 0)  # some node commits landed
            server.send_signal(signal.SIGKILL)
            await asyncio.to_thread(server.wait_exited)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(server.start)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    views = [await api.get_run(TENANT, i) for i in ids]
                except Exception:  # the pool may still hand out a connection that died with the server
                    await asyncio.sleep(0.1)
                    continue
                if all(v.finished for v in views):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"not finished: {[(v.run_id, v.status, v.checkpoint_seq) for v in views]}")
        finally:
            await worker.shutdown()
        health = worker.health()
        assert [v.status for v in views] == ["succeeded"] * len(ids)
        assert health.tick_errors + health.ticks.get("execution_failed", 0) + health.readiness_failures > 0
        effects = await fetch(store, "SELECT run_id, node, count(*) AS n FROM agent_effects GROUP BY run_id, node")
        assert len(effects) == len(ids) * 10 and {e["n"] for e in effects} == {1}
    finally:
        await store.close()


async def _progress(store: AgentStore) -> bool:
    rows = await fetch(store, "SELECT count(*) AS n FROM agent_effects")
    return bool(rows[0]["n"] >= 8)


async def _until(predicate: Any, _: int) -> None:
    deadline = time.monotonic() + 20
    while not await predicate():
        assert time.monotonic() < deadline, "no progress"
        await asyncio.sleep(0.02)
