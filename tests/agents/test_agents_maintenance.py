"""Maintenance, deadline cancellation: per-tenant cursors and poisoned-item skipping (the child-run tasks are
tests/agents/test_agents_children.py and, with real processes, test_agents_children_kill.py)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agents_helpers import TENANT, build_registry, fetch, make_scheduler
from agents_workers import tail

from adx.agents import AgentRuns, AgentStore, AgentWorkerReadiness, ExecutedOutcome, RunStatus
from adx.agents._maintenance import AgentMaintenance, AgentMaintenanceOptions
from adx.errors import InvalidInputError


async def _poison(store: AgentStore, run_id: object) -> None:
    """A fault fixture: any cancellation request for this run fails inside the database."""
    async with store.connection("poison") as conn:
        await conn.execute(
            "CREATE FUNCTION adx_test_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.run_id = '{run_id}' AND NEW.cancel_requested_at IS NOT NULL THEN"
            " RAISE EXCEPTION 'poisoned row'; END IF; RETURN NEW; END $$"
        )
        await conn.execute(
            "CREATE TRIGGER adx_test_poison BEFORE UPDATE ON adx_agent_runs FOR EACH ROW"
            " EXECUTE FUNCTION adx_test_poison()"
        )


async def test_deadlines_cancel_skip_a_poisoned_row_and_resume_from_the_cursor(store: AgentStore) -> None:
    registry = build_registry()
    runs = AgentRuns(store, registry)
    await store.ensure_tenant("other")
    poisoned = await runs.submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=0.001)
    late = await runs.submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=0.002)
    fine = await runs.submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=3600)
    foreign = await runs.submit("other", "chain", "1", {"count": 0}, deadline_seconds=0.001)
    await asyncio.sleep(0.05)
    await _poison(store, poisoned.run_id)
    options = AgentMaintenanceOptions(page_size=1)
    first = AgentMaintenance(store, [TENANT, "other"], AgentWorkerReadiness.database(store), options)
    assert await first.tick() == 1  # the poisoned row failed; the other tenant's page went on
    assert (await runs.get_run("other", foreign.run_id)).cancel_requested
    assert not (await runs.get_run(TENANT, late.run_id)).cancel_requested  # page size 1: next tick

    # A new maintenance process resumes from the persisted cursor: past the poisoned row, to the next one.
    second = AgentMaintenance(store, [TENANT, "other"], AgentWorkerReadiness.database(store), options)
    assert await second.tick() == 0
    assert (await runs.get_run(TENANT, late.run_id)).cancel_requested
    assert await second.tick() == 0  # both tenants' passes end here; cursors go back to the start
    assert await second.tick() == 1  # the next pass revisits the poisoned row
    cursors = await fetch(
        store,
        "SELECT tenant_id, passes FROM adx_agent_maintenance_cursors WHERE task = 'deadline_cancellation' ORDER BY 1",
    )
    assert [(c["tenant_id"], c["passes"] >= 1) for c in cursors] == [("acme", True), ("other", True)]
    health = second.health()
    assert health.deadline_cancellations == 1 and health.item_errors == 1 and health.tenants == 2
    assert str(late.run_id) not in repr(health)

    # A worker confirms the cancellation; the run within its deadline and the poisoned one are untouched.
    scheduler = make_scheduler(store, registry)
    executed = [(await scheduler.tick()).executed for _ in range(3)]
    assert executed == [ExecutedOutcome.SUCCEEDED, ExecutedOutcome.CANCELLED, ExecutedOutcome.SUCCEEDED]
    assert (await runs.get_run(TENANT, late.run_id)).status is RunStatus.CANCELLED
    assert not (await runs.get_run(TENANT, fine.run_id)).cancel_requested
    assert not (await runs.get_run(TENANT, poisoned.run_id)).cancel_requested


async def test_maintenance_binds_1_to_128_distinct_tenants(store: AgentStore) -> None:
    ready = AgentWorkerReadiness.database(store)
    with pytest.raises(InvalidInputError, match="tenants"):
        AgentMaintenance(store, [], ready)
    with pytest.raises(InvalidInputError, match="distinct"):
        AgentMaintenance(store, [TENANT, TENANT], ready)
    with pytest.raises(InvalidInputError, match="tenants"):
        AgentMaintenance(store, [f"t{i}" for i in range(129)], ready)
    with pytest.raises(InvalidInputError, match="deadline_seconds"):
        await AgentRuns(store, build_registry()).submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=0)


@pytest.mark.req("AGT-19")
async def test_run_loop_stops_without_closing_the_shared_store(store: AgentStore) -> None:
    runs = AgentRuns(store, build_registry())
    late = await runs.submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=0.001)
    maintenance = AgentMaintenance(
        store, [TENANT], AgentWorkerReadiness.database(store), AgentMaintenanceOptions(interval_seconds=0.02)
    )
    loop = asyncio.create_task(maintenance.run())
    for _ in range(200):
        if (await runs.get_run(TENANT, late.run_id)).cancel_requested:
            break
        await asyncio.sleep(0.02)
    maintenance.stop()
    await asyncio.wait_for(loop, 5)
    assert maintenance.health().state == "stopped" and maintenance.health().ticks >= 1
    assert (await runs.get_run(TENANT, late.run_id)).cancel_requested
    await store.check_schema()  # the shared pool is still open


@pytest.mark.slow
@pytest.mark.req("AGT-17")
async def test_maintenance_process_resumes_after_sigkill(store: AgentStore, postgres_dsn: str, tmp_path: Path) -> None:
    runs = AgentRuns(store, build_registry())
    ids = [(await runs.submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=0.001)).run_id for _ in range(200)]
    config = tmp_path / "maintenance.toml"
    config.write_text(
        f'database_url = "{postgres_dsn}"\ntenants = ["{TENANT}"]\npage_size = 5\ninterval_seconds = 0.1\n'
    )
    log = tmp_path / "maintenance.log"

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", "from adx.cli import main; main()", "agent", "maintenance", "--config", str(config)],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )

    async def requested() -> int:
        rows = await fetch(
            store,
            "SELECT count(*) AS n FROM adx_agent_runs WHERE run_id = ANY(%s) AND cancel_requested_at IS NOT NULL",
            ids,
        )
        return int(rows[0]["n"])

    first = start()
    try:
        deadline = time.monotonic() + 60
        while await requested() < 20:
            assert time.monotonic() < deadline and first.poll() is None, tail(log)
            await asyncio.sleep(0.02)
    finally:
        first.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.wait)
    at_kill = await requested()
    [cursor] = await fetch(
        store, "SELECT after_id FROM adx_agent_maintenance_cursors WHERE task = %s", "deadline_cancellation"
    )
    assert 20 <= at_kill < 200 and cursor["after_id"] is not None  # killed mid-pass, its cursor persisted
    second = start()
    try:
        deadline = time.monotonic() + 90
        while await requested() < 200:
            assert time.monotonic() < deadline and second.poll() is None, tail(log)
            await asyncio.sleep(0.1)
    finally:
        second.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(second.wait, 30)
    assert code == 0, tail(log)
    assert "agent maintenance stopped" in tail(log)


@pytest.mark.req("AGT-19")
async def test_expired_readiness_pauses_new_maintenance_work(store: AgentStore) -> None:
    runs = AgentRuns(store, build_registry())
    late = await runs.submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=0.001)
    healthy = False

    async def check() -> bool:
        return healthy

    readiness = AgentWorkerReadiness(check, interval_seconds=0.05, ttl_seconds=0.1)
    maintenance = AgentMaintenance(
        store, [TENANT], readiness, AgentMaintenanceOptions(interval_seconds=0.02, error_interval_seconds=0.02)
    )
    loop = asyncio.create_task(maintenance.run())
    try:
        await asyncio.sleep(0.4)
        assert maintenance.health().ticks == 0 and not maintenance.health().ready
        assert not (await runs.get_run(TENANT, late.run_id)).cancel_requested
        healthy = True
        for _ in range(200):
            if (await runs.get_run(TENANT, late.run_id)).cancel_requested:
                break
            await asyncio.sleep(0.02)
        assert (await runs.get_run(TENANT, late.run_id)).cancel_requested
    finally:
        maintenance.stop()
        await asyncio.wait_for(loop, 5)
