"""Tenant tick: fixed-cutoff keyset scan in queue order, stable claim IDs, contention as skip (AGT-11)."""

from __future__ import annotations

from typing import Any

import pytest
from agents_helpers import TENANT, build_registry, fetch, make_scheduler
from test_agents_lifecycle import approval_graph

from adx.agents import (
    AgentRuns,
    AgentStore,
    DurableGraphDriverOptions,
    DurableTenantSchedulerOptions,
    ExecutedOutcome,
    ShutdownSignal,
    TickOutcome,
)
from adx.agents._rows import Candidate


@pytest.fixture
def registry() -> Any:
    return build_registry(approval_graph)


@pytest.fixture
def api(store: AgentStore, registry: Any) -> AgentRuns:
    return AgentRuns(store, registry)


@pytest.mark.req("AGT-11")
async def test_idle_and_cancelled_outcomes(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    scheduler = make_scheduler(store, registry)
    report = await scheduler.tick()
    assert report.outcome is TickOutcome.IDLE and report.pages == 1 and report.candidates == 0
    run = await api.submit(TENANT, "chain", "1", {"count": 0})
    signal = ShutdownSignal()
    signal.set()
    assert (await scheduler.tick(signal)).outcome is TickOutcome.CANCELLED  # shutdown before claim
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "queued" and view.fence == 0


@pytest.mark.req("AGT-11")
async def test_scan_limit_reached_on_a_bounded_page_ceiling(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    waiting = make_scheduler(store, registry)
    for _ in range(6):
        await api.submit(TENANT, "approval", "1", {})
        assert (await waiting.tick()).executed is ExecutedOutcome.WAITING
    small = make_scheduler(store, registry, options=DurableTenantSchedulerOptions(TENANT, page_size=2, max_pages=2))
    report = await small.tick()
    assert (report.outcome, report.pages, report.candidates) == (TickOutcome.SCAN_LIMIT_REACHED, 2, 4)
    enough = make_scheduler(store, registry, options=DurableTenantSchedulerOptions(TENANT, page_size=2, max_pages=4))
    report = await enough.tick()
    assert (report.outcome, report.pages, report.candidates) == (TickOutcome.IDLE, 4, 6)
    # A run submitted after the tick's cutoff is not part of that tick's snapshot; the next tick sees it.
    bounded = make_scheduler(
        store, registry, options=DurableTenantSchedulerOptions(TENANT, page_size=2, max_candidates=6)
    )
    await api.submit(TENANT, "chain", "1", {"count": 0})
    report = await bounded.tick()
    assert report.outcome is TickOutcome.SCAN_LIMIT_REACHED and report.candidates == 6


@pytest.mark.req("AGT-11")
async def test_queue_order_stable_claim_ids_and_contention_skip(
    store: AgentStore, registry: Any, api: AgentRuns
) -> None:
    first = await api.submit(TENANT, "chain", "1", {"count": 0})
    second = await api.submit(TENANT, "chain", "1", {"count": 0})
    scheduler = make_scheduler(store, registry)
    candidate = Candidate(first.run_id, 1, first.revision, True)
    assert scheduler.claim_attempt_id(7, candidate) == scheduler.claim_attempt_id(7, candidate)
    assert scheduler.claim_attempt_id(7, candidate) != scheduler.claim_attempt_id(8, candidate)
    other = make_scheduler(store, registry)
    assert other.claim_attempt_id(7, candidate) != scheduler.claim_attempt_id(7, candidate)

    # Another transaction holds the first run's row: the tick skips it (contention) and runs the second.
    async with store.connection("lock") as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM adx_agent_runs WHERE run_id = %s FOR UPDATE", (first.run_id,))
        report = await scheduler.tick()
        assert report.outcome is TickOutcome.EXECUTED and report.run_id == second.run_id
        assert report.contended == 1 and report.candidates == 2
        report = await scheduler.tick()
        assert (report.outcome, report.contended) == (TickOutcome.IDLE, 1)
    report = await scheduler.tick()
    assert report.run_id == first.run_id and report.executed is ExecutedOutcome.SUCCEEDED


@pytest.mark.req("AGT-11", "AGT-16")
async def test_yielded_and_deferred_outcomes(store: AgentStore, api: AgentRuns) -> None:
    calls: list[int] = []

    def flaky(ex: Any) -> None:
        from adx.agents import Next

        async def once(ctx: Any, state: Any) -> Any:
            calls.append(ctx.attempt)
            if len(calls) == 1:
                raise RuntimeError("transient")
            return Next()

        g = ex.graph(
            "flaky",
            "1",
            entry="once",
            input_schema="urn:adx-test:schema:any-object:1.0.0",
            output_schema="urn:adx-test:schema:any-object:1.0.0",
        )
        g.node("once", once).edge("once", "__end__").terminal(lambda s: {})

    registry = build_registry(approval_graph, flaky)
    runs = AgentRuns(store, registry)
    run = await runs.submit(TENANT, "chain", "1", {"count": 0})
    scheduler = make_scheduler(
        store,
        registry,
        driver=DurableGraphDriverOptions(lease_seconds=5, max_nodes_per_claim=4, retry_backoff_seconds=0.05),
    )
    outcomes = [(await scheduler.tick()).executed for _ in range(3)]
    assert outcomes == [ExecutedOutcome.YIELDED, ExecutedOutcome.YIELDED, ExecutedOutcome.SUCCEEDED]
    released = await fetch(
        store, "SELECT payload FROM adx_agent_events WHERE run_id = %s AND kind = 'released'", run.run_id
    )
    assert [e["payload"]["outcome"] for e in released] == ["yielded", "yielded"]

    flaky_run = await runs.submit(TENANT, "flaky", "1", {})
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.DEFERRED and report.run_id == flaky_run.run_id
    import asyncio

    await asyncio.sleep(0.1)  # retry backoff of the test options (0.05 s)
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    assert calls == [1, 2]


@pytest.mark.req("AGT-11")
async def test_a_tenant_scheduler_only_sees_its_tenant(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    await store.ensure_tenant("other")
    theirs = await api.submit("other", "chain", "1", {"count": 0})
    mine = make_scheduler(store, registry)
    assert (await mine.tick()).outcome is TickOutcome.IDLE
    other = make_scheduler(store, registry, options=DurableTenantSchedulerOptions("other"))
    report = await other.tick()
    assert report.run_id == theirs.run_id and report.executed is ExecutedOutcome.SUCCEEDED
