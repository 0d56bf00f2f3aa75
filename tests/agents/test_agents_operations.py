"""Operations on runs (issue 15): typed status, list_runs with paging, wait, history, retry of a failed run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents_helpers import ANY_OBJECT, TENANT, build_registry, make_scheduler

from adx.agents import (
    AgentRuns,
    AgentStore,
    ExecutableGraphRegistryBuilder,
    ExecutedOutcome,
    Fail,
    Next,
    NodeContext,
    RunStatus,
)
from adx.errors import ConflictError, InvalidInputError, NotFoundError


class Flaky:
    def __init__(self) -> None:
        self.fail = True

    def register(self, ex: ExecutableGraphRegistryBuilder) -> None:
        async def first(ctx: NodeContext, state: dict[str, Any]) -> Next:
            return Next(update={"first": state.get("first", 0) + 1})

        async def second(ctx: NodeContext, state: dict[str, Any]) -> Next | Fail:
            if self.fail:
                return Fail("the upstream said no")
            return Next(update={"second": True})

        g = ex.graph("flaky", "1", entry="first", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
        g.node("first", first).edge("first", "second")
        g.node("second", second).edge("second", "__end__")
        g.terminal(lambda s: {"first": s["first"], "second": s["second"]})


@pytest.mark.req("AGT-16")
async def test_list_runs_pages_newest_first_and_filters(store: AgentStore) -> None:
    registry = build_registry()
    runs = AgentRuns(store, registry)
    ids = [(await runs.submit(TENANT, "chain", "1", {"count": i})).run_id for i in range(5)]
    assert (await make_scheduler(store, registry).tick()).executed is ExecutedOutcome.SUCCEEDED  # the oldest
    reader = AgentRuns(store)  # no registry needed to operate on runs
    page = await reader.list_runs(TENANT, limit=2)
    seen = [v.run_id for v in page.runs]
    while page.next_cursor is not None:
        page = await reader.list_runs(TENANT, limit=2, cursor=page.next_cursor)
        seen += [v.run_id for v in page.runs]
    assert seen == ids[::-1]
    queued = await reader.list_runs(TENANT, status=RunStatus.QUEUED)
    assert [v.run_id for v in queued.runs] == ids[:0:-1] and queued.next_cursor is None
    done = await reader.list_runs(TENANT, status="succeeded", graph="chain")
    assert [v.run_id for v in done.runs] == [ids[0]] and done.runs[0].status is RunStatus.SUCCEEDED
    assert (await reader.list_runs(TENANT, graph="order")).runs == ()
    with pytest.raises(InvalidInputError, match="status"):
        await reader.list_runs(TENANT, status="finished")
    with pytest.raises(InvalidInputError, match="cursor"):
        await reader.list_runs(TENANT, cursor="nonsense")
    with pytest.raises(InvalidInputError, match="limit"):
        await reader.list_runs(TENANT, limit=0)
    with pytest.raises(ConflictError, match="registry"):
        await reader.submit(TENANT, "chain", "1", {"count": 0})


@pytest.mark.req("AGT-16")
async def test_wait_returns_the_result_once_finished(store: AgentStore) -> None:
    registry = build_registry()
    runs = AgentRuns(store, registry)
    run = await runs.submit(TENANT, "chain", "1", {"count": 0})
    with pytest.raises(TimeoutError):
        await runs.wait(TENANT, run.run_id, timeout=0.3, poll_seconds=0.05)
    waiter = asyncio.create_task(runs.wait(TENANT, run.run_id, poll_seconds=0.05))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await make_scheduler(store, registry).tick()
    result = await asyncio.wait_for(waiter, 10)
    assert result.status is RunStatus.SUCCEEDED and result.artifact == {"count": 10}


@pytest.mark.req("AGT-16")
async def test_retry_goes_on_from_the_checkpoint_before_the_failure(store: AgentStore) -> None:
    flaky = Flaky()
    registry = build_registry(flaky.register)
    runs = AgentRuns(store, registry)
    run = await runs.submit(TENANT, "flaky", "1", {})
    scheduler = make_scheduler(store, registry)
    assert (await scheduler.tick()).executed is ExecutedOutcome.FAILED
    failed = await runs.get_result(TENANT, run.run_id)
    assert failed is not None and failed.status is RunStatus.FAILED
    with pytest.raises(ConflictError, match="only a failed run"):
        await _retry_twice(runs, run.run_id)
    flaky.fail = False
    assert (await scheduler.tick()).executed is ExecutedOutcome.SUCCEEDED
    result = await runs.get_result(TENANT, run.run_id)
    # "first" ran once: the retry went on from the checkpoint after it, not from the start.
    assert result is not None and result.artifact == {"first": 1, "second": True}
    history = await runs.history(TENANT, run.run_id)
    kinds = [e.kind for e in history]
    assert kinds.count("retried") == 1 and kinds[-1] == "succeeded" and "failed" in kinds
    assert kinds.index("failed") < kinds.index("retried")
    with pytest.raises(ConflictError, match="only a failed run"):
        await runs.retry(TENANT, run.run_id)


async def _retry_twice(runs: AgentRuns, run_id: Any) -> None:
    view = await runs.retry(TENANT, run_id)
    assert view.status is RunStatus.QUEUED and not view.finished
    assert await runs.get_result(TENANT, run_id) is None
    await runs.retry(TENANT, run_id)  # a queued run is not failed: refused


@pytest.mark.req("AGT-16")
async def test_fork_starts_a_new_run_from_a_chosen_checkpoint(store: AgentStore) -> None:
    registry = build_registry()
    runs = AgentRuns(store, registry)
    source = await runs.submit(TENANT, "chain", "1", {"count": 0})
    scheduler = make_scheduler(store, registry)
    assert (await scheduler.tick()).executed is ExecutedOutcome.SUCCEEDED
    fork = await runs.fork(TENANT, source.run_id, 6)
    assert fork.run_id != source.run_id and fork.status is RunStatus.QUEUED
    assert (await scheduler.tick()).executed is ExecutedOutcome.SUCCEEDED
    result = await runs.get_result(TENANT, fork.run_id)
    # Six nodes had run before checkpoint 6: the fork ran the other four only, from count 6.
    assert result is not None and result.artifact == {"count": 10} and result.usage["node_commits"] == 4
    assert (await runs.get_run(TENANT, source.run_id)).status is RunStatus.SUCCEEDED
    with pytest.raises(NotFoundError, match="keeps no checkpoint 99"):
        await runs.fork(TENANT, source.run_id, 99)
    with pytest.raises(ConflictError, match="end"):
        await runs.fork(TENANT, source.run_id, 11)
    with pytest.raises(InvalidInputError, match="checkpoint_seq"):
        await runs.fork(TENANT, source.run_id, -1)
