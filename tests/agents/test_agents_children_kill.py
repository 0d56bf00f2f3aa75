"""The maintenance role with real processes: ``adx agent worker`` and ``adx agent maintenance`` on a real
PostgreSQL, the maintenance process SIGKILLed mid-pass and started again."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import agents_childapp
import pytest
from agents_helpers import TENANT, fetch
from agents_workers import start_worker, stop, tail, wait_started

from adx.agents import AgentRuns, AgentStore, RunStatus


async def _poison(store: AgentStore, run_id: object) -> None:
    """A fault fixture: any cancellation request for this run fails inside the database. Each attempt is
    counted, and its clock time kept, in sequences (which a rolled-back transaction does not undo)."""
    async with store.connection("poison") as conn:
        await conn.execute("CREATE SEQUENCE adx_test_poison_hits")
        await conn.execute("CREATE SEQUENCE adx_test_poison_last")
        await conn.execute(
            "CREATE FUNCTION adx_test_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.run_id = '{run_id}' AND NEW.cancel_requested_at IS NOT NULL THEN"
            "   PERFORM nextval('adx_test_poison_hits');"
            "   PERFORM setval('adx_test_poison_last', (extract(epoch FROM clock_timestamp()) * 1e6)::bigint);"
            "   RAISE EXCEPTION 'poisoned row'; END IF; RETURN NEW; END $$"
        )
        await conn.execute(
            "CREATE TRIGGER adx_test_poison BEFORE UPDATE ON adx_agent_runs FOR EACH ROW"
            " EXECUTE FUNCTION adx_test_poison()"
        )


async def _poison_hits(store: AgentStore) -> tuple[int, int]:
    [row] = await fetch(
        store,
        "SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM adx_test_poison_hits) AS hits,"
        " (SELECT last_value FROM adx_test_poison_last) AS at_us",
    )
    return int(row["hits"]), int(row["at_us"])


def _maintenance(config: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "from adx.cli import main; main()", "agent", "maintenance", "--config", str(config)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


async def _until(what: str, check: Any, within: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {within}s\n" + "\n".join(tail(log) for log in logs))
        await asyncio.sleep(0.02)


@pytest.mark.slow
@pytest.mark.req("AGT-15", "AGT-17")
async def test_maintenance_cancels_past_deadline_propagates_publishes_skips_poison_and_resumes_after_sigkill(
    store: AgentStore, postgres_dsn: str, tmp_path: Path
) -> None:
    """Maintenance cancels a run past its deadline, propagates cancellation to child runs, publishes a join,
    skips a poisoned row and resumes from its cursor after a SIGKILL (issue 15's must-show)."""
    runs = AgentRuns(store, agents_childapp.build())
    hold = {"value": 0, "mode": "hold"}  # waits until cancelled
    poisoned = await runs.submit(TENANT, "kid", "1", hold, deadline_seconds=0.001)
    expired = [(await runs.submit(TENANT, "kid", "1", hold, deadline_seconds=0.001)).run_id for _ in range(11)]
    joined = await runs.submit(
        TENANT, "family", "1", {"kids": [{"value": 3, "mode": "ok"}, {"value": 4, "mode": "ok"}]}
    )
    doomed = await runs.submit(TENANT, "family", "1", {"kids": [hold, hold]}, deadline_seconds=5)
    await _poison(store, poisoned.run_id)

    worker_config = tmp_path / "worker.toml"
    worker_config.write_text(
        f'database_url = "{postgres_dsn}"\ntenant_id = "{TENANT}"\nregistrations = "agents_childapp"\n'
    )
    worker_log = tmp_path / "worker.log"
    worker = start_worker(worker_config, postgres_dsn, worker_log)
    config = tmp_path / "maintenance.toml"
    config.write_text(
        f'database_url = "{postgres_dsn}"\ntenants = ["{TENANT}"]\npage_size = 2\n'
        "interval_seconds = 0.4\nerror_interval_seconds = 0.4\n"
    )
    log = tmp_path / "maintenance.log"
    logs = [worker_log, log]

    async def requested(ids: list[Any]) -> list[Any]:
        rows = await fetch(
            store,
            "SELECT run_id FROM adx_agent_runs WHERE run_id = ANY(%s) AND cancel_requested_at IS NOT NULL",
            ids,
        )
        return [r["run_id"] for r in rows]

    async def mid_pass() -> bool:
        hits, _ = await _poison_hits(store)
        return hits == 1 and len(await requested(expired)) >= 3

    try:
        await wait_started(worker, worker_log, 0)
        first = _maintenance(config, log)
        try:
            await _until("a first pass half done", mid_pass, 60, logs)
        finally:
            first.send_signal(signal.SIGKILL)
            await asyncio.to_thread(first.wait)
        done_at_kill = await requested(expired)
        hits_at_kill, _ = await _poison_hits(store)
        [cursor] = await fetch(
            store, "SELECT after_id FROM adx_agent_maintenance_cursors WHERE task = 'deadline_cancellation'"
        )
        tail_ids = [r for r in expired if r not in done_at_kill]
        assert hits_at_kill == 1 and cursor["after_id"] is not None and tail_ids, "killed mid-pass, cursor kept"

        second = _maintenance(config, log)
        try:

            async def converged() -> bool:
                statuses = await fetch(
                    store, "SELECT status FROM adx_agent_runs WHERE run_id = ANY(%s)", [*expired, doomed.run_id]
                )
                if any(s["status"] != "cancelled" for s in statuses):
                    return False
                parent = await runs.get_run(TENANT, doomed.run_id)
                done = await runs.get_result(TENANT, joined.run_id)
                hits, _ = await _poison_hits(store)
                return parent.children_settled and done is not None and hits >= 2

            await _until("deadlines, propagation, settlement, the join and a revisit", converged, 90, logs)
        finally:
            second.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(second.wait, 30)
        assert code == 0, tail(log)
    finally:
        await stop(worker)

    # Resumed from the cursor: the tail of the interrupted pass was done before the next pass came back to the
    # poisoned row (a restart from the start would have hit the poisoned row first).
    _, revisit_us = await _poison_hits(store)
    [last] = await fetch(
        store,
        "SELECT max(extract(epoch FROM cancel_requested_at) * 1e6)::bigint AS at_us FROM adx_agent_runs"
        " WHERE run_id = ANY(%s)",
        tail_ids,
    )
    assert int(last["at_us"]) <= revisit_us
    # The poisoned row was skipped, never cancelled; the rest of its page was not blocked.
    assert (await runs.get_run(TENANT, poisoned.run_id)).status is RunStatus.WAITING
    # Deadline -> the parent cancelled -> its children cancelled and confirmed -> settled.
    kids = (await runs.children(TENANT, doomed.run_id)).runs
    assert len(kids) == 2 and all(k.status is RunStatus.CANCELLED for k in kids)
    # The join was published with the children's results and the parent finished from them.
    result = await runs.get_result(TENANT, joined.run_id)
    assert result is not None and result.status is RunStatus.SUCCEEDED
    assert [r["artifact"] for r in result.artifact["results"]] == [{"doubled": 6}, {"doubled": 8}]
