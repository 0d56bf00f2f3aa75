"""Seeded random crash interleavings in-process: ticks of fresh schedulers (new identities, as new processes)
are cancelled at random points — mid-node, mid-commit, mid-lifecycle — and leases are expired; a clean
scheduler then finishes everything. Invariants: every run succeeds with the right artifact and every
completed node's side effect exists exactly once (AGT-16, AGT-9, AGT-17)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import pytest
from agents_helpers import TENANT, fetch, make_scheduler

from adx.agents import AgentRuns, AgentStore, DurableGraphDriverOptions, TickOutcome

ROUNDS = 6


@pytest.mark.req("AGT-16", "AGT-9", "AGT-17")
async def test_random_crash_interleavings_keep_effects_exactly_once(store: AgentStore, executables: Any) -> None:
    seed = int(os.environ.get("AGENTS_CRASH_SEED", str(time.time_ns())))
    print(f"AGENTS_CRASH_SEED={seed}")
    rng = random.Random(seed)
    api = AgentRuns(store, executables)
    driver = DurableGraphDriverOptions(lease_seconds=5, max_node_attempts=1000, retry_backoff_seconds=0.01)
    all_ids = []
    crashes = 0
    for _ in range(ROUNDS):
        ids = [(await api.submit(TENANT, "chain", "1", {"count": 0, "delay_ms": 10})).run_id for _ in range(3)]
        all_ids += ids
        for _ in range(rng.randint(3, 8)):
            victim = make_scheduler(store, executables, driver=driver)
            tick = asyncio.create_task(victim.tick())
            await asyncio.sleep(rng.uniform(0, 0.06))
            if not tick.done():
                tick.cancel()
                crashes += 1
            await asyncio.gather(tick, return_exceptions=True)
            if rng.random() < 0.7:  # time passes: the dead owner's lease runs out
                async with store.connection("expire leases") as conn:
                    await conn.execute(
                        "UPDATE adx_agent_runs SET lease_expires_at = now(), available_at = now()"
                        " WHERE lease_owner IS NOT NULL OR available_at > now()"
                    )
        async with store.connection("expire leases") as conn:
            await conn.execute("UPDATE adx_agent_runs SET lease_expires_at = now() WHERE lease_owner IS NOT NULL")
        finisher = make_scheduler(store, executables, driver=driver)
        for _ in range(200):
            report = await finisher.tick()
            if report.outcome is TickOutcome.IDLE and all([(await api.get_run(TENANT, i)).finished for i in ids]):
                break
            if report.outcome is TickOutcome.IDLE:
                await asyncio.sleep(0.02)
        views = [await api.get_run(TENANT, i) for i in ids]
        assert [v.status for v in views] == ["succeeded"] * 3, (seed, views)
    assert crashes > 0
    for run_id in all_ids:
        result = await api.get_result(TENANT, run_id)
        assert result is not None and result.artifact == {"count": 10} and result.usage["node_commits"] == 10
    effects = await fetch(store, "SELECT run_id, node, count(*) AS n FROM agent_effects GROUP BY run_id, node")
    assert len(effects) == len(all_ids) * 10, seed
    assert {e["n"] for e in effects} == {1}, seed
