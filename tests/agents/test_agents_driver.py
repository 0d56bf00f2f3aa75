"""The durable loop: recorded model/tool attempts, lease renewal, quarantine, higher-fence takeover (AGT-16/7)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents_helpers import ANY_OBJECT, TENANT, build_registry, claim_next, fetch, make_scheduler

from adx.agents import (
    AgentRuns,
    AgentStore,
    DurableGraphDriverOptions,
    ExecutableGraphRegistryBuilder,
    ExecutedOutcome,
    ModelChunk,
    Next,
    NodeContext,
    TickOutcome,
    Usage,
)
from adx.errors import UncertainOutcomeError


class CountingModel:
    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: Any) -> Any:
        self.calls += 1
        for part in ("du", "ra", "ble"):
            yield ModelChunk(part)
        yield ModelChunk("", usage=Usage(input_tokens=3, output_tokens=3))


class Harness:
    def __init__(self) -> None:
        self.model = CountingModel()
        self.chunks: list[str] = []
        self.crash_after_model = True
        self.tool_calls: dict[str, int] = {"safe": 0, "once": 0}
        self.tool_uncertain = True
        self.block = asyncio.Event()
        self.blocked = asyncio.Event()
        self.cancelled = False

    def register(self, ex: ExecutableGraphRegistryBuilder) -> None:
        ex.register_model_provider("counting", self.model)

        async def think(ctx: NodeContext, state: dict[str, Any]) -> Next:
            async def on_chunk(chunk: ModelChunk) -> None:
                self.chunks.append(chunk.text)

            result = await ctx.model("counting", {"prompt": "p"}, on_chunk=on_chunk)
            if self.crash_after_model:
                self.crash_after_model = False
                raise RuntimeError("node crashed after its model call")
            return Next(update={"text": result.text, "replayed": result.replayed})

        g = ex.graph("thinker", "1", entry="think", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
        g.node("think", think).edge("think", "__end__").terminal(lambda s: s)

        async def safe_tool(args: Any) -> Any:
            self.tool_calls["safe"] += 1
            if self.tool_uncertain:
                self.tool_uncertain = False
                raise UncertainOutcomeError("tool reply lost")
            return {"ok": args["x"]}

        async def once_tool(args: Any) -> Any:
            self.tool_calls["once"] += 1
            raise UncertainOutcomeError("tool reply lost")

        ex.register_tool("safe", safe_tool)
        ex.register_tool("once", once_tool, idempotent=False)

        async def act(ctx: NodeContext, state: dict[str, Any]) -> Next:
            return Next(update={"out": await ctx.tool(state["tool"], {"x": 1})})

        g2 = ex.graph("actor", "1", entry="act", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
        g2.node("act", act).edge("act", "__end__").terminal(lambda s: {"out": s["out"]})

        async def slow(ctx: NodeContext, state: dict[str, Any]) -> Next:
            self.blocked.set()
            try:
                await self.block.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return Next()

        async def always_fails(ctx: NodeContext, state: dict[str, Any]) -> Next:
            raise ValueError("poison")

        g3 = ex.graph("slow", "1", entry="slow", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
        g3.node("slow", slow).edge("slow", "__end__").terminal(lambda s: {})
        g4 = ex.graph("poison", "1", entry="bad", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
        g4.node("bad", always_fails).edge("bad", "__end__").terminal(lambda s: {})


@pytest.fixture
def harness() -> Harness:
    return Harness()


@pytest.fixture
def registry(harness: Harness) -> Any:
    return build_registry(harness.register)


@pytest.fixture
def api(store: AgentStore, registry: Any) -> AgentRuns:
    return AgentRuns(store, registry)


@pytest.mark.req("AGT-16")
async def test_completed_model_call_is_replayed_not_repeated(
    store: AgentStore, registry: Any, api: AgentRuns, harness: Harness
) -> None:
    """Recoverable model attempts with streaming: recorded before dispatch, replayed after a node crash."""
    run = await api.submit(TENANT, "thinker", "1", {})
    scheduler = make_scheduler(store, registry)
    assert (await scheduler.tick()).executed is ExecutedOutcome.DEFERRED
    await asyncio.sleep(0.1)
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    assert harness.model.calls == 1 and harness.chunks == ["du", "ra", "ble", ""]
    result = await api.get_result(TENANT, run.run_id)
    assert result is not None and result.artifact == {"text": "durable", "replayed": True}
    assert result.usage["model_calls"] == 1 and result.usage["input_tokens"] == 3
    attempts = await fetch(
        store, "SELECT kind, status FROM adx_agent_attempts WHERE run_id = %s ORDER BY started_at", run.run_id
    )
    assert [(a["kind"], a["status"]) for a in attempts] == [
        ("node", "failed"),
        ("model", "completed"),
        ("node", "completed"),
    ]


@pytest.mark.req("AGT-7", "AGT-16")
async def test_in_flight_tool_goes_to_higher_fence_recovery(
    store: AgentStore, registry: Any, api: AgentRuns, harness: Harness
) -> None:
    """AGT-7: a failure with same-fence work in flight releases ownership instead of failing the run."""
    run = await api.submit(TENANT, "actor", "1", {"tool": "safe"})
    scheduler = make_scheduler(store, registry)
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.RECOVERY_RELEASED, report
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "queued" and view.fence == 1 and await api.get_result(TENANT, run.run_id) is None
    report = await scheduler.tick()  # fence 2 recovers; the idempotent tool is dispatched again
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    assert harness.tool_calls["safe"] == 2 and (await api.get_run(TENANT, run.run_id)).fence == 2

    # A non-idempotent tool with an unknown outcome is never re-dispatched: terminal failure supervision.
    run = await api.submit(TENANT, "actor", "1", {"tool": "once"})
    assert (await scheduler.tick()).executed is ExecutedOutcome.RECOVERY_RELEASED
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.FAILED, report.lifecycle
    assert harness.tool_calls["once"] == 1
    result = await api.get_result(TENANT, run.run_id)
    assert result is not None and "unknown outcome" in result.failure["reason"]  # type: ignore[index]


@pytest.mark.req("AGT-16")
async def test_lease_renewal_keeps_a_long_node_owned(
    store: AgentStore, registry: Any, api: AgentRuns, harness: Harness
) -> None:
    await api.submit(TENANT, "slow", "1", {})
    owner = make_scheduler(store, registry, driver=DurableGraphDriverOptions(lease_seconds=0.6))
    other = make_scheduler(store, registry)
    tick = asyncio.create_task(owner.tick())
    await harness.blocked.wait()
    await asyncio.sleep(1.5)  # well past the first lease: only renewals keep it
    assert (await other.tick()).outcome is TickOutcome.IDLE
    harness.block.set()
    report = await tick
    assert report.executed is ExecutedOutcome.SUCCEEDED, report


@pytest.mark.req("AGT-16", "AGT-11")
async def test_higher_fence_takeover_continues_from_the_last_checkpoint(
    store: AgentStore, executables: Any, harness: Harness
) -> None:
    """A stalled owner loses its run to a higher fence; its late work is fenced out (ExecutionFailed)."""
    registry = build_registry(harness.register, _blocking_chain(harness))
    api = AgentRuns(store, registry)
    run = await api.submit(TENANT, "chain2", "1", {"count": 0})
    # A long lease: its renewal (every lease/3) cannot race the injected expiry below.
    stalled = make_scheduler(store, registry, driver=DurableGraphDriverOptions(lease_seconds=30))
    tick = asyncio.create_task(stalled.tick())
    await harness.blocked.wait()  # the owner committed n0, n1 and is inside n2
    # Inject the fault at the backend: the owner's lease expires (as after a long pause or partition).
    async with store.connection("expire") as conn:
        await conn.execute("UPDATE adx_agent_runs SET lease_expires_at = now() WHERE run_id = %s", (run.run_id,))
    rescuer = make_scheduler(store, registry)
    report = await rescuer.tick()  # its m2 does not block (only the first entry does)
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    harness.block.set()  # the stalled owner wakes up and tries to commit m2 under fence 1
    stale = await tick
    assert stale.outcome is TickOutcome.EXECUTION_FAILED and "no longer" in (stale.error or ""), stale
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "succeeded" and view.fence == 2
    effects = await fetch(store, "SELECT node, fence FROM agent_effects WHERE run_id = %s ORDER BY node", run.run_id)
    assert [e["node"] for e in effects] == [f"m{i}" for i in range(5)]  # each completed node exactly once
    assert [e["fence"] for e in effects] == [1, 1, 2, 2, 2]


def _blocking_chain(harness: Harness) -> Any:
    def register(ex: ExecutableGraphRegistryBuilder) -> None:
        entered: list[str] = []

        def make(name: str) -> Any:
            async def node(ctx: NodeContext, state: dict[str, Any]) -> Next:
                if name == "m2" and not entered:
                    entered.append(name)
                    harness.blocked.set()
                    await harness.block.wait()

                async def effect(conn: Any) -> None:
                    await conn.execute("INSERT INTO agent_effects VALUES (%s, %s, %s)", (ctx.run_id, name, ctx.fence))

                ctx.on_commit(effect)
                return Next(update={"count": state["count"] + 1})

            return node

        g = ex.graph("chain2", "1", entry="m0", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
        for i in range(5):
            g.node(f"m{i}", make(f"m{i}")).edge(f"m{i}", f"m{i + 1}" if i < 4 else "__end__")
        g.terminal(lambda s: {"count": s["count"]})

    return register


@pytest.mark.req("AGT-16")
async def test_poison_attempts_are_quarantined(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    failing = await api.submit(TENANT, "poison", "1", {})
    scheduler = make_scheduler(
        store,
        registry,
        driver=DurableGraphDriverOptions(lease_seconds=5, max_node_attempts=3, retry_backoff_seconds=0.01),
    )
    outcomes = []
    for _ in range(3):
        outcomes.append((await scheduler.tick()).executed)
        await asyncio.sleep(0.05)
    assert outcomes == [ExecutedOutcome.DEFERRED, ExecutedOutcome.DEFERRED, ExecutedOutcome.FAILED]
    result = await api.get_result(TENANT, failing.run_id)
    assert result is not None and "failed 3 times" in result.failure["reason"]  # type: ignore[index]

    # A node whose attempts keep dying with their worker (crash-looping) is quarantined at the next claim.
    crashing = await api.submit(TENANT, "chain", "1", {"count": 0})
    for _ in range(3):
        claim = await claim_next(scheduler)
        await store.start_node_attempt(claim, "n0")  # dispatched, then the worker "dies"
        async with store.connection("expire") as conn:
            await conn.execute(
                "UPDATE adx_agent_runs SET lease_expires_at = now() WHERE run_id = %s", (crashing.run_id,)
            )
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.FAILED, report
    result = await api.get_result(TENANT, crashing.run_id)
    assert result is not None and result.failure is not None and "quarantined" in result.failure["reason"]
    assert (await fetch(store, "SELECT count(*) AS n FROM agent_effects WHERE run_id = %s", crashing.run_id)) == [
        {"n": 0}
    ]


@pytest.mark.req("AGT-16")
async def test_budget_bounds_the_steps(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    run = await api.submit(TENANT, "chain", "1", {"count": 0}, budget={"max_steps": 3})
    report = await make_scheduler(store, registry).tick()
    assert report.executed is ExecutedOutcome.FAILED
    result = await api.get_result(TENANT, run.run_id)
    assert result is not None and result.failure == {"reason": "budget exhausted: max_steps=3"}
    assert result.usage["node_commits"] == 3


@pytest.mark.req("AGT-16")
async def test_owner_cut_off_from_the_database_loses_its_lease_and_its_node_task(
    store: AgentStore, postgres_dsn: str, registry: Any, api: AgentRuns, harness: Harness
) -> None:
    """An owner whose lease renewals fail (a partition at its store boundary) cancels its node when its lease
    runs out; a higher fence takes the run over; the old owner's tick reports ExecutionFailed."""
    from adx.errors import UnavailableError

    run = await api.submit(TENANT, "slow", "1", {})
    owner_store = await AgentStore.open(postgres_dsn, max_size=4)
    try:

        async def partitioned(*args: Any, **kwargs: Any) -> bool:
            raise UnavailableError("injected: database unreachable from this owner")

        owner = make_scheduler(owner_store, registry, driver=DurableGraphDriverOptions(lease_seconds=0.6))
        tick = asyncio.create_task(owner.tick())
        await harness.blocked.wait()
        owner_store.renew_lease = partitioned  # type: ignore[method-assign]
        report = await asyncio.wait_for(tick, 5)
        assert report.outcome is TickOutcome.EXECUTION_FAILED and "lease lost" in (report.error or ""), report
        assert harness.cancelled  # the node task was cancelled, not left running
    finally:
        await owner_store.close()
    harness.block.set()
    await asyncio.sleep(0.1)
    rescuer = make_scheduler(store, registry)
    report = await rescuer.tick()
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    assert (await api.get_run(TENANT, run.run_id)).fence == 2
