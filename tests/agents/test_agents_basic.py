from __future__ import annotations

import pytest
from agents_helpers import TENANT, make_scheduler

from adx.agents import AgentRuns, AgentStore, ExecutableGraphRegistry, ExecutedOutcome, TickOutcome


@pytest.mark.req("AGT-16", "AGT-6")
async def test_chain_runs_to_success(store: AgentStore, executables: ExecutableGraphRegistry, runs: AgentRuns) -> None:
    run = await runs.submit(TENANT, "chain", "1", {"count": 0})
    assert run.status == "queued"
    scheduler = make_scheduler(store, executables)
    report = await scheduler.tick()
    assert report.outcome is TickOutcome.EXECUTED, report
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    view = await runs.get_run(TENANT, run.run_id)
    assert view.status == "succeeded" and not view.leased
    result = await runs.get_result(TENANT, run.run_id)
    assert result is not None and result.artifact == {"count": 10}
    assert result.usage["node_commits"] == 10
    assert (await scheduler.tick()).outcome is TickOutcome.IDLE
