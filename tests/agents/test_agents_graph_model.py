"""The graph model: routing, reducers, goto checks, model-call budgets, checkpoint retention (AGT-16)."""

from __future__ import annotations

from typing import Any

import pytest
from agents_helpers import ANY_OBJECT, TENANT, build_registry, fetch, make_scheduler

from adx.agents import (
    AgentRuns,
    AgentStore,
    DurableGraphDriverOptions,
    ExecutableGraphRegistryBuilder,
    ExecutedOutcome,
    ModelChunk,
    Next,
    NodeContext,
    Usage,
)


class Echo:
    async def stream(self, request: Any) -> Any:
        yield ModelChunk(str(request["n"]), usage=Usage(input_tokens=5, output_tokens=5))


def graphs(ex: ExecutableGraphRegistryBuilder) -> None:
    ex.register_reducer("append", lambda state, update: {**state, "seen": [*state.get("seen", []), update]})
    ex.register_model_provider("echo", Echo())

    async def step(ctx: NodeContext, state: dict[str, Any]) -> Next:
        return Next(update=len(state.get("seen", [])))

    async def jump(ctx: NodeContext, state: dict[str, Any]) -> Next:
        return Next(goto=state.get("goto"))

    g = ex.graph("loop", "1", entry="step", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
    g.node("step", step, reducer="append")
    g.route("step", lambda s: "step" if len(s["seen"]) < 5 else "jump", ["step", "jump"])
    g.node("jump", jump).route("jump", lambda s: "__end__", ["__end__"])
    g.terminal(lambda s: {"seen": s["seen"]})

    async def chatty(ctx: NodeContext, state: dict[str, Any]) -> Next:
        total = []
        for n in range(state["calls"]):
            total.append((await ctx.model("echo", {"n": n})).text)
        return Next(update={"texts": total})

    g2 = ex.graph("chatty", "1", entry="chat", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
    g2.node("chat", chatty).edge("chat", "__end__").terminal(lambda s: {"texts": s["texts"]})


@pytest.fixture
def registry() -> Any:
    return build_registry(graphs)


@pytest.mark.req("AGT-16")
async def test_routes_reducers_and_retention(store: AgentStore, registry: Any) -> None:
    api = AgentRuns(store, registry)
    store.checkpoint_retention = 3
    run = await api.submit(TENANT, "loop", "1", {})
    assert (await make_scheduler(store, registry).tick()).executed is ExecutedOutcome.SUCCEEDED
    result = await api.get_result(TENANT, run.run_id)
    assert result is not None and result.artifact == {"seen": [0, 1, 2, 3, 4]}
    kept = await fetch(store, "SELECT seq, kind FROM adx_agent_checkpoints WHERE run_id = %s ORDER BY seq", run.run_id)
    # Six node commits and a terminal checkpoint; each node commit prunes to the newest three.
    assert [k["seq"] for k in kept] == [4, 5, 6, 7] and kept[-1]["kind"] == "terminal"

    bad = await api.submit(TENANT, "loop", "1", {"goto": "nowhere"})
    scheduler = make_scheduler(store, registry, driver=DurableGraphDriverOptions(lease_seconds=5, max_node_attempts=1))
    assert (await scheduler.tick()).executed is ExecutedOutcome.FAILED
    failed = await api.get_result(TENANT, bad.run_id)
    assert failed is not None and "may route only to ['__end__']" in failed.failure["reason"]  # type: ignore[index]


@pytest.mark.req("AGT-16")
async def test_model_call_budget_is_enforced_before_dispatch(store: AgentStore, registry: Any) -> None:
    api = AgentRuns(store, registry)
    ok = await api.submit(TENANT, "chatty", "1", {"calls": 2}, budget={"max_model_calls": 2})
    over = await api.submit(TENANT, "chatty", "1", {"calls": 3}, budget={"max_model_calls": 2})
    scheduler = make_scheduler(store, registry)
    assert (await scheduler.tick()).executed is ExecutedOutcome.SUCCEEDED
    assert (await scheduler.tick()).executed is ExecutedOutcome.FAILED
    done = await api.get_result(TENANT, ok.run_id)
    assert done is not None and done.artifact == {"texts": ["0", "1"]} and done.usage["input_tokens"] == 10
    refused = await api.get_result(TENANT, over.run_id)
    assert refused is not None and refused.failure == {"reason": "budget exhausted: max_model_calls=2"}
    assert refused.usage["model_calls"] == 2  # the third call was never dispatched
