"""Exactly-once users can rely on (issue 15): stable idempotency keys, the reconcile hook, early approvals.

In-process schedulers on real PostgreSQL. A worker "dies" mid-tool by having its tick cancelled while the
tool blocks (the call stays recorded as started, the lease held); the lease is then expired by SQL (a fault
fixture for time) and a second scheduler, a higher fence, continues the run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import agents_testapp
import pytest
from agents_helpers import ANY_OBJECT, TENANT, build_registry, fetch, make_scheduler

from adx.agents import (
    AgentRuns,
    AgentStore,
    ExecutableGraphRegistryBuilder,
    ExecutedOutcome,
    Next,
    NodeContext,
    Reconciled,
    ResolveOutcome,
    TickOutcome,
    ToolCall,
)
from adx.errors import InvalidInputError, NotFoundError


class Effects:
    """A non-idempotent external effect (a list) whose tool can be made to hang before or after acting."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.keys: list[str] = []
        self.hang: str | None = None  # "before" | "after" | None
        self.started = asyncio.Event()
        self.decision: str = "lookup"  # "lookup" | "fail"
        self.reconciled: list[str] = []

    def register(self, ex: ExecutableGraphRegistryBuilder, *, with_reconcile: bool = True) -> None:
        async def effect(arguments: Any, call: ToolCall) -> Any:
            self.keys.append(call.idempotency_key)
            self.started.set()
            if self.hang == "before":
                await asyncio.Event().wait()
            self.done.append(call.idempotency_key)
            if self.hang == "after":
                await asyncio.Event().wait()
            return {"effect": call.idempotency_key}

        async def reconcile(arguments: Any, call: ToolCall) -> Reconciled:
            if self.decision == "fail":
                self.reconciled.append("fail")
                return Reconciled.fail("the payment provider cannot tell")
            decided = (
                Reconciled.done({"effect": call.idempotency_key})
                if call.idempotency_key in self.done
                else Reconciled.not_done()
            )
            self.reconciled.append(decided.outcome.value)
            return decided

        ex.register_tool("effect", effect, idempotent=False, reconcile=reconcile if with_reconcile else None)

        async def act(ctx: NodeContext, state: dict[str, Any]) -> Next:
            result = await ctx.tool("effect", {"x": 1})
            return Next(update={"effect": result["effect"]})

        g = ex.graph("effect", "1", entry="act", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
        g.node("act", act).edge("act", "__end__")
        g.terminal(lambda s: {"effect": s["effect"]})


async def _die_mid_tool(store: AgentStore, effects: Effects, scheduler: Any) -> None:
    """The first owner dies while the tool call is in flight; its lease is then expired."""
    tick = asyncio.create_task(scheduler.tick())
    await asyncio.wait_for(effects.started.wait(), 10)
    tick.cancel()
    with pytest.raises(asyncio.CancelledError):
        await tick
    [attempt] = await fetch(store, "SELECT status, fence FROM adx_agent_attempts WHERE kind = 'tool'")
    assert attempt == {"status": "started", "fence": 1}
    async with store.connection("fault: expire lease") as conn:
        await conn.execute("UPDATE adx_agent_runs SET lease_expires_at = now() WHERE lease_owner IS NOT NULL")
    effects.hang = None


@pytest.mark.req("AGT-16")
@pytest.mark.parametrize("hang", ["before", "after"])
async def test_reconcile_decides_an_unknown_outcome(store: AgentStore, hang: str) -> None:
    """Died before the effect: reconcile says not done, the tool runs again with the same key. Died after:
    reconcile says done, the tool is not called again. Either way exactly one effect."""
    effects = Effects()
    effects.hang = hang
    registry = build_registry(effects.register)
    runs = AgentRuns(store, registry)
    run = await runs.submit(TENANT, "effect", "1", {})
    await _die_mid_tool(store, effects, make_scheduler(store, registry))
    report = await make_scheduler(store, registry).tick()
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    result = await runs.get_result(TENANT, run.run_id)
    assert result is not None
    key = f"{run.run_id}/0/act/effect#0"
    assert result.artifact == {"effect": key}
    assert effects.done == [key]  # exactly one effect
    if hang == "before":
        assert effects.reconciled == ["not_done"] and effects.keys == [key, key]  # dispatched again, same key
    else:
        assert effects.reconciled == ["done"] and effects.keys == [key]  # never dispatched again
    rows = await fetch(store, "SELECT status, fence, error FROM adx_agent_attempts WHERE kind = 'tool' ORDER BY fence")
    assert rows[0]["fence"] == 1
    assert result.usage["tool_calls"] == 1


@pytest.mark.req("AGT-16")
async def test_reconcile_fail_and_no_hook_fail_the_run_with_the_reason(store: AgentStore) -> None:
    for with_hook in (True, False):
        async with store.connection("reset") as conn:
            await conn.execute("DELETE FROM adx_agent_runs")
        effects = Effects()
        effects.hang = "after"
        effects.decision = "fail"
        registry = build_registry(lambda ex, e=effects, h=with_hook: e.register(ex, with_reconcile=h))
        runs = AgentRuns(store, registry)
        run = await runs.submit(TENANT, "effect", "1", {})
        await _die_mid_tool(store, effects, make_scheduler(store, registry))
        report = await make_scheduler(store, registry).tick()
        assert report.executed is ExecutedOutcome.FAILED, report
        result = await runs.get_result(TENANT, run.run_id)
        assert result is not None and result.failure is not None
        reason = str(result.failure)
        assert ("cannot tell" in reason) if with_hook else ("no reconcile hook" in reason)
        assert len(effects.done) == 1


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.fixture
def order_env(monkeypatch: pytest.MonkeyPatch, postgres_dsn: str, tmp_path: Path) -> Path:
    receipts = tmp_path / "receipts.log"
    monkeypatch.setenv("AGENTS_TEST_DSN", postgres_dsn)
    monkeypatch.setenv("AGENTS_TEST_RECEIPTS", str(receipts))
    monkeypatch.setenv("AGENTS_TEST_TOOL_PAUSE_MS", "0")
    return receipts


@pytest.mark.req("AGT-5", "AGT-16")
async def test_early_approval_is_consumed_at_the_wait_and_a_typo_is_refused(store: AgentStore, order_env: Path) -> None:
    async with store.connection("setup") as conn:
        await conn.execute(agents_testapp.LEDGER_DDL)
    registry = build_registry()
    runs = AgentRuns(store, registry)
    early = await runs.submit(TENANT, "order", "1", {"amount": 5})
    late = await runs.submit(TENANT, "order", "1", {"amount": 7})
    assert await runs.resolve(TENANT, early.run_id, "approve", {"by": "ann"}) is ResolveOutcome.STORED_EARLY
    assert await runs.resolve(TENANT, early.run_id, "approve", {"by": "ann"}) is ResolveOutcome.DUPLICATE
    with pytest.raises(InvalidInputError, match=r"wait_id.*declares no interrupt 'aprove'"):
        await runs.resolve(TENANT, early.run_id, "aprove", {"by": "ann"})
    with pytest.raises(InvalidInputError):
        await runs.resolve(TENANT, late.run_id, "aprove", {"by": "bob"})

    scheduler = make_scheduler(store, registry)
    for _ in range(6):
        if (await scheduler.tick()).outcome is TickOutcome.IDLE:
            break
    # The early-approved run went through its wait without anyone resolving it again.
    result = await runs.get_result(TENANT, early.run_id)
    assert result is not None and result.status == "succeeded", result
    assert result.artifact["approved_by"] == "ann"
    view = await runs.get_run(TENANT, late.run_id)
    assert view.status == "waiting" and [w.wait_id for w in view.waits] == ["approve"]
    assert await runs.resolve(TENANT, late.run_id, "approve", {"by": "bob"}) is ResolveOutcome.RESOLVED
    assert await runs.resolve(TENANT, late.run_id, "approve", {"by": "bob"}) is ResolveOutcome.DUPLICATE
    assert (await scheduler.tick()).executed is ExecutedOutcome.SUCCEEDED
    result = await runs.get_result(TENANT, late.run_id)
    assert result is not None and result.artifact["approved_by"] == "bob"
    # The lost-ACK retry after the run finished is still a duplicate, not a new early approval.
    assert await runs.resolve(TENANT, late.run_id, "approve", {"by": "bob"}) is ResolveOutcome.DUPLICATE
    assert len(_lines(order_env)) == 2
    ledger = await fetch(store, "SELECT count(*) AS n FROM agent_ledger")
    assert ledger[0]["n"] == 2


@pytest.mark.req("AGT-16")
async def test_graph_without_declared_interrupts_still_reports_not_found(store: AgentStore) -> None:
    runs = AgentRuns(store, build_registry())
    run = await runs.submit(TENANT, "chain", "1", {"count": 0})
    with pytest.raises(NotFoundError, match="declares no interrupts"):
        await runs.resolve(TENANT, run.run_id, "approve", True)
