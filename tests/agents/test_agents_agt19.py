"""AGT-19, clause by clause, on real PostgreSQL: expired readiness pauses maintenance (and it resumes), shutdown
only starts cleanup and leaves the shared store usable, an ExecutionFailed tick leaves the worker ticking, and
the health endpoint is neither an entry point for work nor a source of usage/billing."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import httpx
import pytest
from agents_helpers import TENANT, build_registry, fetch, make_scheduler

from adx.agents import (
    AgentRuns,
    AgentStore,
    AgentWorker,
    AgentWorkerBinding,
    AgentWorkerOptions,
    AgentWorkerReadiness,
    EvidenceRequest,
    ExecutedOutcome,
    GraphLifecycleEvidenceProvider,
    LifecycleEvidence,
    RunStatus,
    TickOutcome,
)
from adx.agents._deploy import serve_health
from adx.agents._maintenance import AgentMaintenance, AgentMaintenanceOptions


async def _until(predicate: Any, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _ready() -> AgentWorkerReadiness:
    async def ok() -> bool:
        return True

    return AgentWorkerReadiness(ok, interval_seconds=0.05, ttl_seconds=1.0)


@pytest.mark.req("AGT-19")
async def test_maintenance_pauses_when_readiness_evidence_expires_and_resumes_when_it_returns(
    store: AgentStore,
) -> None:
    """Ready, then the dependency fails: once the evidence's TTL passes no new maintenance tick starts and a
    past-deadline run is left alone; when the check passes again the pending work is done."""
    runs = AgentRuns(store, build_registry())
    healthy = True
    checks = 0

    async def check() -> bool:
        nonlocal checks
        checks += 1
        return healthy

    readiness = AgentWorkerReadiness(check, interval_seconds=0.05, ttl_seconds=0.15)
    maintenance = AgentMaintenance(
        store, [TENANT], readiness, AgentMaintenanceOptions(interval_seconds=0.02, error_interval_seconds=0.02)
    )
    loop = asyncio.create_task(maintenance.run())
    try:

        async def ticked() -> bool:
            return maintenance.health().ticks >= 3

        await _until(ticked)
        assert maintenance.health().ready
        healthy = False
        await asyncio.sleep(0.3)  # past the TTL: the cached evidence expired and the re-check failed
        paused_at = maintenance.health().ticks
        checks_at = checks
        late = await runs.submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=0.001)
        await asyncio.sleep(0.4)
        assert maintenance.health().ticks == paused_at and not maintenance.health().ready
        assert checks > checks_at  # it keeps checking while paused, it does not give up
        assert not (await runs.get_run(TENANT, late.run_id)).cancel_requested
        assert not loop.done()

        healthy = True

        async def cancelled() -> bool:
            return (await runs.get_run(TENANT, late.run_id)).cancel_requested

        await _until(cancelled)
        assert maintenance.health().ticks > paused_at and maintenance.health().ready
    finally:
        maintenance.stop()
        await asyncio.wait_for(loop, 5)


@pytest.mark.req("AGT-19")
async def test_a_raising_readiness_check_pauses_maintenance_instead_of_ending_it(store: AgentStore) -> None:
    """An application check's own bug counts as not ready (as for the worker): maintenance pauses, and
    resumes when the check passes again; it does not die with the exception."""
    runs = AgentRuns(store, build_registry())
    broken = True

    async def check() -> bool:
        if broken:
            raise RuntimeError("dependency probe bug")
        return True

    readiness = AgentWorkerReadiness(check, interval_seconds=0.05, ttl_seconds=0.1)
    maintenance = AgentMaintenance(
        store, [TENANT], readiness, AgentMaintenanceOptions(interval_seconds=0.02, error_interval_seconds=0.02)
    )
    late = await runs.submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=0.001)
    loop = asyncio.create_task(maintenance.run())
    try:
        await asyncio.sleep(0.3)
        assert not loop.done(), loop
        assert maintenance.health().ticks == 0 and not maintenance.health().ready
        assert not (await runs.get_run(TENANT, late.run_id)).cancel_requested
        broken = False

        async def cancelled() -> bool:
            return (await runs.get_run(TENANT, late.run_id)).cancel_requested

        await _until(cancelled)
    finally:
        maintenance.stop()
        await asyncio.wait_for(loop, 5)


@pytest.mark.req("AGT-19")
async def test_shutdown_and_stop_start_cleanup_and_leave_the_shared_store_usable(store: AgentStore) -> None:
    """A worker and a maintenance role share one store (one pool) with the application: stopping both ends their
    tasks, and the same pool then still admits, executes and reads runs for everyone else."""
    registry = build_registry()
    runs = AgentRuns(store, registry)
    worker = await AgentWorker.start(
        AgentWorkerBinding.tenant(make_scheduler(store, registry)),
        _ready(),
        AgentWorkerOptions(slots=2, idle_poll_seconds=0.02, liveness_grace_seconds=1.0),
    )
    maintenance = AgentMaintenance(store, [TENANT], _ready(), AgentMaintenanceOptions(interval_seconds=0.02))
    role = asyncio.create_task(maintenance.run())
    first = await runs.submit(TENANT, "chain", "1", {"count": 0})

    async def finished() -> bool:
        return (await runs.get_run(TENANT, first.run_id)).finished

    await _until(finished)
    maintenance.stop()  # only initiates: the loop ends on its own
    worker.begin_shutdown()
    await asyncio.wait_for(role, 5)
    await worker.shutdown()
    assert worker.health().state == "stopped" and maintenance.health().state == "stopped"
    assert all(t.done() for t in worker._slots)

    # The shared pool is open and serves new work: submit, execute on a fresh scheduler, read the result.
    await store.check_schema()
    second = await runs.submit(TENANT, "chain", "1", {"count": 0})
    report = await make_scheduler(store, registry).tick()
    assert report.executed is ExecutedOutcome.SUCCEEDED and report.run_id == second.run_id, report
    assert (await runs.get_run(TENANT, second.run_id)).status is RunStatus.SUCCEEDED
    result = await runs.get_result(TENANT, second.run_id)
    assert result is not None and result.artifact == {"count": 10}


class _BrokenOnce(GraphLifecycleEvidenceProvider):
    """A fault fixture: the first evidence recovery raises a non-ADX exception (a run-local lifecycle bug)."""

    def __init__(self) -> None:
        self.failures = 0

    async def recover(self, store: AgentStore, request: EvidenceRequest) -> LifecycleEvidence:
        if self.failures == 0:
            self.failures += 1
            raise RuntimeError("evidence provider bug")
        return await super().recover(store, request)


@pytest.mark.req("AGT-19")
async def test_the_scheduler_ticks_again_after_an_execution_failed_tick(store: AgentStore) -> None:
    registry = build_registry()
    runs = AgentRuns(store, registry)
    evidence = _BrokenOnce()
    scheduler = make_scheduler(store, registry, evidence=evidence)
    run = await runs.submit(TENANT, "chain", "1", {"count": 0})
    failed = await scheduler.tick()
    assert failed.outcome is TickOutcome.EXECUTION_FAILED and "evidence provider bug" in (failed.error or "")
    view = await runs.get_run(TENANT, run.run_id)
    assert not view.leased and not view.finished  # the exact fence was released, not left to its lease
    again = await scheduler.tick()
    assert again.outcome is TickOutcome.EXECUTED and again.executed is ExecutedOutcome.SUCCEEDED, again
    assert again.run_id == run.run_id and evidence.failures == 1
    other = await runs.submit(TENANT, "chain", "1", {"count": 0})
    assert (await scheduler.tick()).run_id == other.run_id


@pytest.mark.req("AGT-19")
async def test_a_worker_keeps_ticking_after_execution_failed(store: AgentStore) -> None:
    """The same worker (one slot, so the retry cannot come from another slot) executes the run after its tick
    ended in ExecutionFailed, then executes new runs."""
    registry = build_registry()
    runs = AgentRuns(store, registry)
    worker = await AgentWorker.start(
        AgentWorkerBinding.tenant(make_scheduler(store, registry, evidence=_BrokenOnce())),
        _ready(),
        AgentWorkerOptions(slots=1, idle_poll_seconds=0.02, error_backoff_seconds=0.05),
    )
    try:
        ids = [(await runs.submit(TENANT, "chain", "1", {"count": 0})).run_id]

        async def all_succeeded() -> bool:
            return all([(await runs.get_run(TENANT, i)).status is RunStatus.SUCCEEDED for i in ids])

        await _until(all_succeeded)
        ids.append((await runs.submit(TENANT, "chain", "1", {"count": 0})).run_id)
        await _until(all_succeeded)
        health = worker.health()
        assert health.state == "running" and health.ticks["execution_failed"] == 1, health
        assert health.executed.get("succeeded") == 2 and health.tick_errors == 0, health
    finally:
        await worker.shutdown()


async def _usage_and_runs(store: AgentStore) -> dict[str, Any]:
    """Every durable trace health traffic could leave: runs, usage rows, events, outbox, per-table digests."""
    tables = await fetch(
        store,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        " AND table_name LIKE %s ORDER BY 1",
        "adx_agent%",
    )
    snapshot: dict[str, Any] = {}
    for row in tables:
        name = row["table_name"]
        if name == "adx_agent_workers":
            continue  # liveness heartbeats (off in the test below, excluded in case the table exists)
        [digest] = await fetch(
            store, f"SELECT count(*) AS n, md5(string_agg(t::text, '|' ORDER BY t::text)) AS d FROM {name} t"
        )
        snapshot[name] = (digest["n"], digest["d"])
    assert "adx_agent_usage" in snapshot and "adx_agent_runs" in snapshot
    return snapshot


@pytest.mark.req("AGT-19", "AGT-14")
async def test_health_is_not_an_anonymous_entry_point_or_a_billing_source(store: AgentStore) -> None:
    """The endpoint of a real worker refuses every submission-shaped request (any method, any path but GET
    /healthz) and its answers change nothing: no run, no usage row, no worker counter moves."""
    registry = build_registry()
    runs = AgentRuns(store, registry)
    done = await runs.submit(TENANT, "chain", "1", {"count": 0})
    readiness = AgentWorkerReadiness(_always, interval_seconds=30.0, ttl_seconds=60.0)  # no check during the test
    worker = await AgentWorker.start(
        AgentWorkerBinding.tenant(make_scheduler(store, registry)),
        readiness,
        AgentWorkerOptions(slots=1, idle_poll_seconds=30.0, liveness_grace_seconds=None),
    )
    server = await serve_health(worker.health, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:

        async def executed() -> bool:
            return worker.health().ticks.get("idle", 0) >= 1 and (await runs.get_run(TENANT, done.run_id)).finished

        await _until(executed)  # the run is done and the slot sleeps in its idle poll: nothing else ticks
        before_db = await _usage_and_runs(store)
        before = dataclasses.replace(worker.health(), uptime_seconds=0.0)
        submission = {"tenant_id": TENANT, "graph": "chain", "version": "1", "input": {"count": 0}}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            for _ in range(20):
                ok = await client.get("/healthz")
                assert ok.status_code == 200 and set(ok.json()) == {f.name for f in dataclasses.fields(before)}
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                for path in ("/healthz", "/runs", "/v1/runs", f"/v1/tenants/{TENANT}/runs", "/"):
                    answer = await client.request(method, path, json=submission)
                    assert answer.status_code == 404 and answer.json() == {"error": "not found"}, (method, path)
            for path in ("/runs", f"/runs/{done.run_id}", "/metrics", "/usage", "/healthz/../runs"):
                answer = await client.get(path)
                assert answer.status_code == 404, path
                assert str(done.run_id) not in answer.text
        after = dataclasses.replace(worker.health(), uptime_seconds=0.0)
        assert after == before  # no tick, no readiness check, no counter of any kind moved
        assert await _usage_and_runs(store) == before_db
        assert len(await fetch(store, "SELECT run_id FROM adx_agent_runs")) == 1
    finally:
        server.close()
        await server.wait_closed()
        await worker.shutdown()


async def _always() -> bool:
    return True
