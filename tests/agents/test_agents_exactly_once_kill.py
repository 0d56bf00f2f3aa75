"""The must-show of issue 15: SIGKILL real workers mid-tool; every run correct, every effect exactly once.

20 runs of the ``order`` graph (agents_testapp): a non-idempotent ``charge`` (a ledger row on its own
connection), an approval wait (half the runs approved before they reach it, half while waiting), and a
receipt appended to a file by a non-idempotent tool - both effects on the documented exactly-once path
(idempotency key + reconcile hook). Two worker processes run at all times; four times the owner of a run
whose tool call is in flight is SIGKILLed and replaced. Leases are the default 30 s: the runs continue by
worker liveness, and the time from each kill to the run's next owner is measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

import agents_testapp
import pytest
from agents_helpers import TENANT, fetch
from agents_workers import WorkerSet, kill, stop, tail, write_config

from adx.agents import AgentRuns, AgentStore, ExecutableGraphRegistry, ResolveOutcome
from adx.errors import ConflictError

RUNS = 20
KILLS = 4


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
@pytest.mark.req("AGT-16", "AGT-17", "AGT-5")
async def test_sigkill_mid_tool_four_times_twenty_runs_exactly_twenty_effects(
    store: AgentStore, executables: ExecutableGraphRegistry, postgres_dsn: str, tmp_path: Path
) -> None:
    async with store.connection("setup") as conn:
        await conn.execute(agents_testapp.LEDGER_DDL)
    receipts = tmp_path / "receipts.log"
    env = {"AGENTS_TEST_RECEIPTS": str(receipts), "AGENTS_TEST_TOOL_PAUSE_MS": "300"}
    config = write_config(
        tmp_path / "worker.toml",
        postgres_dsn,
        TENANT,
        slots=4,
        idle_poll_seconds=0.05,
        max_node_attempts=100,
        drain_seconds=5,
    )
    log = tmp_path / "worker.log"
    runs = AgentRuns(store, executables)
    ids: list[uuid.UUID] = []
    early: set[uuid.UUID] = set()

    async def approve_one() -> bool:
        # An operator answering one approval request of the late half (those not approved early).
        for row in await fetch(store, "SELECT run_id FROM adx_agent_runs WHERE status = 'waiting'"):
            if row["run_id"] not in early:
                with contextlib.suppress(ConflictError):  # it moved on meanwhile
                    await runs.resolve(TENANT, row["run_id"], "approve", {"by": f"late-{row['run_id']}"})
                    return True
        return False

    async def approver() -> None:
        while True:
            if not await approve_one():
                await asyncio.sleep(0.05)

    pool = WorkerSet(config, postgres_dsn, log, **env)
    workers, spawn = pool.procs, pool.spawn

    approving: asyncio.Task[None] | None = None
    kill_to_continue: list[float] = []
    try:
        ids.extend([(await runs.submit(TENANT, "order", "1", {"amount": i + 1})).run_id for i in range(RUNS)])
        for run_id in ids[::2]:
            early.add(run_id)
            outcome = await runs.resolve(TENANT, run_id, "approve", {"by": f"early-{run_id}"})
            assert outcome is ResolveOutcome.STORED_EARLY
        await spawn()
        await spawn()
        hunting = time.monotonic()
        while len(kill_to_continue) < KILLS:
            if time.monotonic() - hunting > 60:
                state = await fetch(store, "SELECT status, count(*) FROM adx_agent_runs GROUP BY 1")
                pytest.fail(f"no tool call in flight to kill after {kill_to_continue}: {state} {tail(log)}")
            # The owner of a run whose tool call is in flight under the run's current fence.
            rows = await fetch(
                store,
                "SELECT r.run_id, r.fence, r.lease_owner FROM adx_agent_runs r JOIN adx_agent_attempts a"
                " ON a.run_id = r.run_id AND a.fence = r.fence AND a.kind = 'tool' AND a.status = 'started'"
                " WHERE r.lease_owner IS NOT NULL LIMIT 1",
            )
            if not rows:
                # Nothing in flight: let one more approved run reach its receipt (the kills pace the approvals,
                # so the work lasts however slowly workers start on a loaded machine).
                await approve_one()
                await asyncio.sleep(0.05)
                continue
            victim = int(rows[0]["lease_owner"].split(":")[1])
            if victim not in workers:
                await asyncio.sleep(0.01)
                continue
            await kill(workers.pop(victim))
            killed = time.monotonic()
            run_id, fence = rows[0]["run_id"], rows[0]["fence"]
            respawn = asyncio.create_task(spawn())  # the peer is up meanwhile; the replacement joins it
            while True:
                [row] = await fetch(store, "SELECT fence, status FROM adx_agent_runs WHERE run_id = %s", run_id)
                if row["fence"] > fence:
                    break
                assert time.monotonic() - killed < 30, f"run {run_id} did not continue: {tail(log)}"
                await asyncio.sleep(0.01)
            kill_to_continue.append(time.monotonic() - killed)
            await respawn

        approving = asyncio.create_task(approver())
        deadline = time.monotonic() + 120
        while True:
            views = [await runs.get_run(TENANT, r) for r in ids]
            if all(v.finished for v in views):
                break
            assert time.monotonic() < deadline, [(v.run_id, v.status) for v in views if not v.finished]
            await asyncio.sleep(0.1)
    finally:
        if approving is not None:
            approving.cancel()
        codes = [await stop(w) for w in workers.values()]
    assert codes == [0] * len(codes), tail(log)

    reconciles = await fetch(store, "SELECT tool, outcome, count(*) AS n FROM agent_reconciles GROUP BY 1, 2")
    print(f"kill->continue seconds: {[round(s, 3) for s in kill_to_continue]}; reconciles: {reconciles}")
    assert len(kill_to_continue) == KILLS and max(kill_to_continue) < 2.0
    assert reconciles, "no kill landed in a tool call's unknown-outcome window"
    # 20 correct results.
    for run_id in ids:
        result = await runs.get_result(TENANT, run_id)
        assert result is not None and result.status == "succeeded", (run_id, result)
        who = "early" if run_id in early else "late"
        amount = ids.index(run_id) + 1
        assert result.artifact == {
            "amount": amount,
            "charge_id": f"{run_id}/0/charge/charge#0",
            "approved_by": f"{who}-{run_id}",
            "receipt": f"{run_id}/3/receipt/write_receipt#0",
        }
    # Exactly 20 of each effect: one ledger row and one receipt line per run.
    ledger = await fetch(store, "SELECT run_id, count(*) AS n, sum(amount) AS amount FROM agent_ledger GROUP BY 1")
    assert sorted((r["run_id"], r["n"]) for r in ledger) == sorted((r, 1) for r in ids)
    lines = await asyncio.to_thread(_lines, receipts)
    assert len(lines) == RUNS
    assert sorted(uuid.UUID(line.split(" ")[1]) for line in lines) == sorted(ids)
