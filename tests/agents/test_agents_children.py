"""Child runs and joins: ``ctx.spawn``, the ``Join`` wait, ``parent_run_id``, children listings, and the
maintenance tasks that act on them (join publication, failure convergence, cancellation propagation and
settlement), driven step by step in-process on a real PostgreSQL with a real scheduler."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import agents_childapp
import pytest
from agents_helpers import TENANT, claim_next, fetch, make_scheduler
from apistack import api_stack  # noqa: F401 (fixture)

from adx.agents import (
    AgentRuns,
    AgentStore,
    AgentWorkerReadiness,
    ChildRun,
    DurableTenantScheduler,
    ExecutableGraphRegistry,
    Join,
    NodeWaits,
    RunStatus,
    StaleFenceError,
    TickOutcome,
)
from adx.agents._children import spawn_child
from adx.agents._driver import _waits_json
from adx.agents._maintenance import AgentMaintenance, AgentMaintenanceOptions
from adx.errors import InvalidInputError


@pytest.fixture
def family() -> ExecutableGraphRegistry:
    return agents_childapp.build()


async def _drain(scheduler: DurableTenantScheduler) -> None:
    """Tick until the tenant has nothing claimable."""
    for _ in range(100):
        if (await scheduler.tick()).outcome is TickOutcome.IDLE:
            return
    raise AssertionError("the scheduler never went idle")


def _maintenance(store: AgentStore) -> AgentMaintenance:
    return AgentMaintenance(store, [TENANT], AgentWorkerReadiness.database(store), AgentMaintenanceOptions())


@pytest.mark.req("AGT-15")
async def test_spawn_join_publication_and_the_children_listing(
    store: AgentStore, family: ExecutableGraphRegistry
) -> None:
    runs = AgentRuns(store, family)
    parent = await runs.submit(TENANT, "family", "1", {"kids": [{"value": v, "mode": "ok"} for v in (1, 2, 3)]})
    scheduler = make_scheduler(store, family)
    await _drain(scheduler)
    view = await runs.get_run(TENANT, parent.run_id)
    assert view.status is RunStatus.WAITING and view.children == 3
    assert [(w.kind.value, w.wait_id, w.resolved) for w in view.waits] == [("join", "kids", False)]
    kids = (await runs.children(TENANT, parent.run_id)).runs
    assert [k.status for k in kids] == [RunStatus.SUCCEEDED] * 3
    assert {k.parent_run_id for k in kids} == {parent.run_id} and all(k.graph == "kid" for k in kids)
    assert (await runs.get_run(TENANT, parent.run_id)).status is RunStatus.WAITING  # nobody published yet

    maintenance = _maintenance(store)
    assert await maintenance.tick() == 0
    assert maintenance.health().joins_published == 1
    await _drain(scheduler)
    result = await runs.get_result(TENANT, parent.run_id)
    assert result is not None and result.status is RunStatus.SUCCEEDED
    # The join's outcomes come in spawn order, each with its artifact.
    assert result.artifact == {
        "results": [{"status": "succeeded", "artifact": {"doubled": 2 * v}, "graph": "kid"} for v in (1, 2, 3)]
    }
    assert await maintenance.tick() == 0  # a finished parent whose children are all finished: settled
    assert (await runs.get_run(TENANT, parent.run_id)).children_settled
    page = await runs.children(TENANT, parent.run_id, limit=2)
    rest = await runs.children(TENANT, parent.run_id, limit=2, cursor=page.next_cursor)
    assert [k.run_id for k in page.runs + rest.runs] == [k.run_id for k in kids] and rest.next_cursor is None
    assert (await runs.children(TENANT, kids[0].run_id)).runs == ()


async def test_spawn_is_idempotent_per_step_and_fenced(store: AgentStore, family: ExecutableGraphRegistry) -> None:
    runs = AgentRuns(store, family)
    parent = await runs.submit(TENANT, "family", "1", {"kids": []})
    claim = await claim_next(make_scheduler(store, family))

    async def spawn(call_key: str, value: int, at: Any = claim) -> ChildRun:
        return await spawn_child(
            store,
            family,
            at,
            step=0,
            call_key=call_key,
            graph="kid",
            version=None,
            input={"value": value, "mode": "ok"},
            budget=None,
            deadline_seconds=None,
        )

    first = await spawn("spawn:kid#0", 1)
    again = await spawn("spawn:kid#0", 1)  # the node ran again (a crash): the same child, not a second one
    other = await spawn("spawn:kid#1", 2)
    assert first == again and first.run_id != other.run_id and first.version == "1"
    assert (await runs.get_run(TENANT, parent.run_id)).children == 2
    with pytest.raises(InvalidInputError, match="version '9' is not registered"):
        await spawn_child(
            store, family, claim, step=0, call_key="x", graph="kid", version="9", input={}, budget=None,
            deadline_seconds=None,
        )  # fmt: skip
    # A worker that lost the parent's fence spawns nothing.
    await fetch(store, "UPDATE adx_agent_runs SET fence = fence + 1 WHERE run_id = %s RETURNING 1", parent.run_id)
    with pytest.raises(StaleFenceError):
        await spawn("spawn:kid#2", 3)
    assert [
        r["n"]
        for r in await fetch(store, "SELECT count(*) AS n FROM adx_agent_runs WHERE parent_run_id = %s", parent.run_id)
    ] == [2]


async def test_a_node_that_runs_again_after_spawning_gets_the_same_children(
    store: AgentStore, family: ExecutableGraphRegistry
) -> None:
    runs = AgentRuns(store, family)
    parent = await runs.submit(TENANT, "crashing_family", "1", {})
    scheduler = make_scheduler(store, family)
    maintenance = _maintenance(store)
    for _ in range(10):  # the first attempt fails after its spawns and is retried (backoff 50 ms)
        await _drain(scheduler)
        await maintenance.tick()
        if (await runs.get_run(TENANT, parent.run_id)).finished:
            break
        await asyncio.sleep(0.1)
    result = await runs.get_result(TENANT, parent.run_id)
    assert result is not None and result.status is RunStatus.SUCCEEDED, result
    assert result.artifact == {"results": [{"status": "succeeded"}] * 2}
    attempts = await fetch(
        store, "SELECT status FROM adx_agent_attempts WHERE run_id = %s AND kind = 'node' ORDER BY started_at",
        parent.run_id,
    )  # fmt: skip
    assert [a["status"] for a in attempts][:2] == ["failed", "completed"]  # it did run twice
    assert (await runs.get_run(TENANT, parent.run_id)).children == 2
    assert len((await runs.children(TENANT, parent.run_id)).runs) == 2


def test_join_registrations_are_checked() -> None:
    child = ChildRun(uuid.uuid4(), "kid", "1")
    with pytest.raises(InvalidInputError, match=r"waits\.children"):
        _waits_json((Join("j", ()),))
    with pytest.raises(InvalidInputError, match=r"waits\.children"):
        _waits_json((Join("j", (child, child.run_id)),))
    with pytest.raises(InvalidInputError, match="at most one Join"):
        _waits_json(NodeWaits((Join("a", (child,)), Join("b", (child,)))).waits)
    with pytest.raises(InvalidInputError, match=r"waits\.policy"):
        _waits_json((Join("j", (child,), "sometimes"),))  # type: ignore[arg-type]
    [registered] = _waits_json((Join("j", (child,)),))
    assert registered["payload"] == {"children": [str(child.run_id)], "policy": "all"}


@pytest.mark.req("AGT-15")
async def test_failure_convergence_per_join_policy(store: AgentStore, family: ExecutableGraphRegistry) -> None:
    runs = AgentRuns(store, family)
    kids = [{"value": 1, "mode": "fail"}, {"value": 2, "mode": "hold"}, {"value": 3, "mode": "hold"}]
    fast = await runs.submit(TENANT, "family", "1", {"kids": kids, "policy": "fail_fast"})
    every = await runs.submit(
        TENANT, "family", "1", {"kids": [{"value": 4, "mode": "fail"}, {"value": 5, "mode": "ok"}]}
    )
    scheduler = make_scheduler(store, family)
    maintenance = _maintenance(store)
    await _drain(scheduler)
    # fail_fast: the failed child gets its live siblings cancelled; once they are confirmed the join publishes.
    assert await maintenance.tick() == 0
    health = maintenance.health()
    assert health.failure_convergences == 2 and health.joins_published == 1  # ``every`` published at once
    await _drain(scheduler)
    assert await maintenance.tick() == 0
    await _drain(scheduler)
    fast_result = await runs.get_result(TENANT, fast.run_id)
    assert fast_result is not None
    assert [r["status"] for r in fast_result.artifact["results"]] == ["failed", "cancelled", "cancelled"]
    # all: a failed child is reported; its sibling ran to its end.
    every_result = await runs.get_result(TENANT, every.run_id)
    assert every_result is not None
    assert [r["status"] for r in every_result.artifact["results"]] == ["failed", "succeeded"]


@pytest.mark.req("AGT-15")
async def test_cancelling_a_parent_cancels_and_settles_its_children(
    store: AgentStore, family: ExecutableGraphRegistry
) -> None:
    runs = AgentRuns(store, family)
    parent = await runs.submit(TENANT, "family", "1", {"kids": [{"value": 1, "mode": "hold"}] * 2})
    scheduler = make_scheduler(store, family)
    maintenance = _maintenance(store)
    await _drain(scheduler)
    await runs.request_cancellation(TENANT, parent.run_id)
    await _drain(scheduler)
    assert (await runs.get_run(TENANT, parent.run_id)).status is RunStatus.CANCELLED
    kids = (await runs.children(TENANT, parent.run_id)).runs
    assert [k.status for k in kids] == [RunStatus.WAITING] * 2 and not any(k.cancel_requested for k in kids)
    assert await maintenance.tick() == 0  # propagation: the children are asked to cancel
    assert maintenance.health().child_cancellations == 2
    assert not (await runs.get_run(TENANT, parent.run_id)).children_settled
    await _drain(scheduler)  # a worker confirms the children's cancellation
    assert [k.status for k in (await runs.children(TENANT, parent.run_id)).runs] == [RunStatus.CANCELLED] * 2
    assert await maintenance.tick() == 0
    assert (await runs.get_run(TENANT, parent.run_id)).children_settled
    assert maintenance.health().children_settled == 1


@pytest.mark.req("AGT-15")
async def test_a_poisoned_join_never_blocks_the_rest_of_its_page(
    store: AgentStore, family: ExecutableGraphRegistry
) -> None:
    runs = AgentRuns(store, family)
    poisoned = await runs.submit(TENANT, "family", "1", {"kids": [{"value": 1, "mode": "ok"}]})
    healthy = await runs.submit(TENANT, "family", "1", {"kids": [{"value": 2, "mode": "ok"}]})
    scheduler = make_scheduler(store, family)
    await _drain(scheduler)
    # A fault fixture: the first join's stored registration is corrupted.
    await fetch(
        store,
        'UPDATE adx_agent_waits SET payload = \'{"children": "garbage"}\' WHERE run_id = %s RETURNING 1',
        poisoned.run_id,
    )
    maintenance = AgentMaintenance(
        store, [TENANT], AgentWorkerReadiness.database(store), AgentMaintenanceOptions(page_size=2)
    )
    assert await maintenance.tick() == 1  # the poisoned join failed; the page went on
    assert maintenance.health().joins_published == 1
    await _drain(scheduler)
    assert (await runs.get_run(TENANT, healthy.run_id)).status is RunStatus.SUCCEEDED
    assert (await runs.get_run(TENANT, poisoned.run_id)).status is RunStatus.WAITING
    assert await maintenance.tick() == 0  # the page after the cursor is empty: the pass ends
    assert await maintenance.tick() == 1  # the next pass revisits the poisoned join (still failing)


@pytest.mark.req("AGT-15", "SEC-2")
async def test_children_over_http(
    store: AgentStore,
    family: ExecutableGraphRegistry,
    postgres_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    api_stack: Callable[..., Awaitable[Any]],  # noqa: F811
) -> None:
    monkeypatch.setenv("ADX_AGENT_DATABASE_URL", postgres_dsn)
    stack = await api_stack()
    key = await stack.tenant(TENANT)
    other = await stack.tenant("other")
    runs = AgentRuns(store, family)
    parent = await runs.submit(TENANT, "family", "1", {"kids": [{"value": 1, "mode": "ok"}] * 2})
    await _drain(make_scheduler(store, family))
    async with stack.http(key) as http:
        listed = await http.get(f"/v1/agent-runs/{parent.run_id}/children")
        assert listed.status_code == 200, listed.text
        body = listed.json()
        assert len(body["runs"]) == 2 and {r["parentRunId"] for r in body["runs"]} == {str(parent.run_id)}
        assert body["runs"][0]["status"] == "succeeded" and body["nextCursor"] is None
        one = (await http.get(f"/v1/agent-runs/{parent.run_id}")).json()
        assert one["children"] == 2 and one["parentRunId"] is None and one["waits"][0]["kind"] == "join"
        page = await http.get(f"/v1/agent-runs/{parent.run_id}/children", params={"limit": 1})
        assert len(page.json()["runs"]) == 1 and page.json()["nextCursor"]
        assert (await http.get(f"/v1/agent-runs/{uuid.uuid4()}/children")).status_code == 404
    async with stack.http(other) as http:  # another tenant cannot see the run or its children
        assert (await http.get(f"/v1/agent-runs/{parent.run_id}/children")).status_code == 404


async def test_children_in_the_cli(store: AgentStore, family: ExecutableGraphRegistry, postgres_dsn: str) -> None:
    """``adx agent runs children`` lists a run's children; ``runs get`` shows the parent and the child count."""
    runs = AgentRuns(store, family)
    parent = await runs.submit(
        TENANT, "family", "1", {"kids": [{"value": 1, "mode": "ok"}, {"value": 2, "mode": "hold"}]}
    )
    await _drain(make_scheduler(store, family))
    kids = (await runs.children(TENANT, parent.run_id)).runs
    base = [sys.executable, "-c", "from adx.cli import main; main()", "agent", "runs"]
    where = ["--database-url", postgres_dsn, "--tenant", TENANT]

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args, *where], capture_output=True, text=True, timeout=60, check=False)

    listed = await asyncio.to_thread(call, "children", str(parent.run_id))
    assert listed.returncode == 0, listed.stderr
    assert all(str(k.run_id) in listed.stdout for k in kids) and "kid@1" in listed.stdout
    assert "succeeded" in listed.stdout and "waiting" in listed.stdout
    paged = await asyncio.to_thread(call, "children", str(parent.run_id), "--limit", "1")
    assert (
        str(kids[0].run_id) in paged.stdout and str(kids[1].run_id) not in paged.stdout and "--cursor" in paged.stdout
    )
    shown = await asyncio.to_thread(call, "get", str(parent.run_id))
    assert shown.returncode == 0 and "children     2" in shown.stdout and "join 'kids'" in shown.stdout
    child = await asyncio.to_thread(call, "get", str(kids[0].run_id))
    assert f"parent       {parent.run_id}" in child.stdout
    none = await asyncio.to_thread(call, "children", str(kids[0].run_id))
    assert none.returncode == 0 and "no children" in none.stdout
    unknown = await asyncio.to_thread(call, "children", str(uuid.uuid4()))
    assert unknown.returncode != 0 and "does not exist" in unknown.stderr
