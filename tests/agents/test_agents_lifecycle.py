"""Lifecycle edges as single transactions, evidence rules and exact replay (AGT-2..10)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from agents_helpers import (
    ANY_OBJECT,
    TENANT,
    CountingEvidence,
    build_registry,
    claim_next,
    fetch,
    make_scheduler,
    standard_schemas,
)

from adx.agents import (
    AgentRuns,
    AgentStore,
    DurableGraphLifecycleOptions,
    DurableTenantScheduler,
    EvidenceError,
    EvidenceRequest,
    ExecutableGraphRegistryBuilder,
    ExecutedOutcome,
    Fail,
    GraphLifecycleEvidenceProvider,
    Interrupt,
    JsonSchemaRegistryBuilder,
    LifecycleEvidence,
    ModelChunk,
    Next,
    NodeContext,
    NodeWaits,
    StaleFenceError,
    TickOutcome,
    Timer,
    Usage,
    register_standard_graph_driver_event_schema,
    register_standard_graph_lifecycle_event_schema,
)
from adx.agents._handoffs import CancellationHandoff, FailureHandoff, SuccessHandoff, WaitHandoff
from adx.errors import InvalidInputError, UncertainOutcomeError


def approval_graph(ex: ExecutableGraphRegistryBuilder) -> None:
    async def ask(ctx: NodeContext, state: dict[str, Any]) -> Any:
        if ctx.wake is None:
            return NodeWaits((Interrupt("approve", {"question": "ok?"}), Timer("expire", 3600)), update={"asked": True})
        fired = {w.wait_id: w for w in ctx.wake if w.resolved or w.fired}
        return Next(update={"answer": fired["approve"].resolution if "approve" in fired else "expired"})

    g = ex.graph("approval", "1", entry="ask", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
    g.node("ask", ask).edge("ask", "__end__").terminal(lambda s: {"answer": s["answer"]})

    async def nap(ctx: NodeContext, state: dict[str, Any]) -> Any:
        if ctx.wake is None:
            return NodeWaits((Timer("nap", 0.3),))
        return Next(update={"woke": [w.wait_id for w in ctx.wake if w.fired]})

    g2 = ex.graph("napper", "1", entry="nap", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
    g2.node("nap", nap).edge("nap", "__end__").terminal(lambda s: {"woke": s["woke"]})

    async def refuse(ctx: NodeContext, state: dict[str, Any]) -> Fail:
        return Fail("refused by policy")

    g3 = ex.graph("refuser", "1", entry="refuse", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
    g3.node("refuse", refuse).edge("refuse", "__end__").terminal(lambda s: s)


class SilentModel:
    """A streaming model that never reports usage."""

    async def stream(self, request: Any) -> Any:
        yield ModelChunk("hel")
        yield ModelChunk("lo")


class MeteredModel:
    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: Any) -> Any:
        self.calls += 1
        yield ModelChunk("a")
        yield ModelChunk("b", usage=Usage(input_tokens=7, output_tokens=2))


def model_graph(ex: ExecutableGraphRegistryBuilder) -> None:
    ex.register_model_provider("silent", SilentModel())
    ex.register_model_provider("metered", MeteredModel())

    async def think(ctx: NodeContext, state: dict[str, Any]) -> Next:
        result = await ctx.model(state["provider"], {"prompt": "hi"})
        return Next(update={"text": result.text})

    g = ex.graph("thinker", "1", entry="think", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
    g.node("think", think).edge("think", "__end__").terminal(lambda s: {"text": s["text"]})


@pytest.fixture
def registry() -> Any:
    return build_registry(approval_graph, model_graph)


@pytest.fixture
def api(store: AgentStore, registry: Any) -> AgentRuns:
    return AgentRuns(store, registry)


@pytest.mark.req("AGT-2")
async def test_missing_cancellation_schema_stops_lifecycle_startup(store: AgentStore) -> None:
    """AGT-2: without the standard cancellation schema, lifecycle start-up fails closed."""
    schemas = JsonSchemaRegistryBuilder.with_default_limits()
    register_standard_graph_driver_event_schema(schemas)
    register_standard_graph_lifecycle_event_schema(schemas)
    schemas.register(ANY_OBJECT, {"type": "object"})
    ex = ExecutableGraphRegistryBuilder(schemas.build())
    approval_graph(ex)
    with pytest.raises(InvalidInputError, match="agent-cancellation-event"):
        DurableTenantScheduler(store, ex.build(), GraphLifecycleEvidenceProvider())


@pytest.mark.req("AGT-5")
async def test_wait_edge_is_one_transaction_with_database_time(
    store: AgentStore, registry: Any, api: AgentRuns
) -> None:
    """AGT-5: event, consumed result, successor checkpoint, waits with DB time, Waiting, lease released."""
    run = await api.submit(TENANT, "approval", "1", {})
    scheduler = make_scheduler(store, registry)
    report = await scheduler.tick()
    assert (report.outcome, report.executed) == (TickOutcome.EXECUTED, ExecutedOutcome.WAITING)
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "waiting" and not view.leased and view.checkpoint_seq == 1
    [event] = await fetch(store, "SELECT * FROM adx_agent_events WHERE kind = 'waiting' AND run_id = %s", run.run_id)
    waits = await fetch(store, "SELECT * FROM adx_agent_waits WHERE run_id = %s ORDER BY wait_id", run.run_id)
    assert [w["wait_id"] for w in waits] == ["approve", "expire"]
    # Registered with the transaction's database time: the same now() as the event row.
    assert all(w["registered_at"] == event["created_at"] for w in waits)
    expire = waits[1]
    assert expire["due_at"] - expire["registered_at"] == dt.timedelta(seconds=3600)
    [ck] = await fetch(store, "SELECT * FROM adx_agent_checkpoints WHERE run_id = %s AND seq = 1", run.run_id)
    assert ck["kind"] == "wait" and ck["next_node"] == "ask" and ck["state"] == {"asked": True}
    [attempt] = await fetch(
        store, "SELECT status FROM adx_agent_attempts WHERE run_id = %s AND kind = 'node'", run.run_id
    )
    assert attempt["status"] == "completed"
    assert (await scheduler.tick()).outcome is TickOutcome.IDLE  # waiting, nothing fired

    assert await api.resolve_interrupt(TENANT, run.run_id, "approve", "yes") is True
    assert await api.resolve_interrupt(TENANT, run.run_id, "approve", "yes") is False  # exact duplicate
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    result = await api.get_result(TENANT, run.run_id)
    assert result is not None and result.artifact == {"answer": "yes"}


@pytest.mark.req("AGT-5")
async def test_timer_wakes_the_run_by_database_time(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    run = await api.submit(TENANT, "napper", "1", {})
    scheduler = make_scheduler(store, registry)
    assert (await scheduler.tick()).executed is ExecutedOutcome.WAITING
    assert (await scheduler.tick()).outcome is TickOutcome.IDLE
    import asyncio

    await asyncio.sleep(0.4)
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    result = await api.get_result(TENANT, run.run_id)
    assert result is not None and result.artifact == {"woke": ["nap"]}


@pytest.mark.req("AGT-10")
async def test_wait_replay_is_event_first_after_the_run_advanced(
    store: AgentStore, registry: Any, api: AgentRuns
) -> None:
    """AGT-10: an exact retry returns the original commit after a resolver advanced the run to success."""
    run = await api.submit(TENANT, "approval", "1", {})
    scheduler = make_scheduler(store, registry)
    claim = await claim_next(scheduler)
    handoff = await scheduler.loop.driver.drive(claim, scheduler_signal())
    assert isinstance(handoff, WaitHandoff)
    first = await scheduler.loop.lifecycle.commit(handoff)
    assert first.outcome is ExecutedOutcome.WAITING and not first.replayed
    await api.resolve_interrupt(TENANT, run.run_id, "approve", "later")
    assert (await scheduler.tick()).executed is ExecutedOutcome.SUCCEEDED
    before = await api.get_run(TENANT, run.run_id)

    again = await scheduler.loop.lifecycle.commit(handoff)
    assert again.replayed and again.outcome is ExecutedOutcome.WAITING
    assert again.revision == first.revision and again.event_id == first.event_id
    assert first.wait is not None and again.wait is not None
    assert [w["registered_at"] for w in again.wait["waits"]] == [w["registered_at"] for w in first.wait["waits"]]
    after = await api.get_run(TENANT, run.run_id)
    assert after.status == "succeeded" and after.revision == before.revision  # never rolled back

    # Same event identity, different registrations: not the original commit -> stale, fail closed.
    forged = WaitHandoff(
        handoff.claim,
        handoff.event_id,
        handoff.step,
        handoff.attempt_id,
        handoff.resume_node,
        handoff.state,
        handoff.waits[:1],
    )
    with pytest.raises(StaleFenceError):
        await scheduler.loop.lifecycle.commit(forged)


def scheduler_signal() -> Any:
    from adx.agents import ShutdownSignal

    return ShutdownSignal()


def _lose_ack_once(store: AgentStore, edge: str) -> list[str]:
    seen: list[str] = []

    def after_commit(name: str) -> None:
        if name == edge and not seen:
            seen.append(name)
            raise UncertainOutcomeError(f"{name}: reply lost (injected)")

    store.faults.after_commit = after_commit
    return seen


@pytest.mark.req("AGT-9", "AGT-6")
async def test_lost_ack_success_replays_exactly_without_rereading_evidence(
    store: AgentStore, registry: Any, api: AgentRuns
) -> None:
    run = await api.submit(TENANT, "chain", "1", {"count": 1})
    evidence = CountingEvidence()
    scheduler = make_scheduler(store, registry, evidence=evidence)
    claim = await claim_next(scheduler)
    handoff = await scheduler.loop.driver.drive(claim, scheduler_signal())
    assert isinstance(handoff, SuccessHandoff)
    lost = _lose_ack_once(store, "commit succeeded")
    result = await scheduler.loop.lifecycle.commit(handoff)
    assert lost and result.replayed and result.outcome is ExecutedOutcome.SUCCEEDED
    assert result.result is not None and result.result["artifact"] == {"count": 11}
    assert evidence.calls == 1
    again = await scheduler.loop.lifecycle.commit(handoff)
    assert again.replayed and again.result == result.result and again.usage == result.usage
    assert evidence.calls == 1  # the retry restores the committed result, never re-reads evidence
    [row] = await fetch(store, "SELECT count(*) AS n FROM adx_agent_results WHERE run_id = %s", run.run_id)
    assert row["n"] == 1

    # Any other terminal change for this run fails closed as stale.
    other = SuccessHandoff(claim, uuid.uuid4(), handoff.step, handoff.artifact, handoff.usage)
    with pytest.raises(StaleFenceError):
        await scheduler.loop.lifecycle.commit(other)
    cancel = CancellationHandoff(claim, uuid.uuid4(), handoff.step, None, handoff.usage)
    with pytest.raises(StaleFenceError):
        await scheduler.loop.lifecycle.commit(cancel)
    with pytest.raises(StaleFenceError):  # the same event, but expecting another terminal status
        await scheduler.loop.lifecycle.replay_terminal(claim, handoff.event_id, "failed", handoff.revision)
    with pytest.raises(StaleFenceError):  # the same event, but not committed at the expected revision + 1
        await scheduler.loop.lifecycle.replay_terminal(claim, handoff.event_id, "succeeded", handoff.revision + 1)
    assert evidence.calls == 1
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "succeeded"


@pytest.mark.req("AGT-9", "AGT-7")
async def test_lost_ack_failure_replays_exactly(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    run = await api.submit(TENANT, "refuser", "1", {})
    evidence = CountingEvidence()
    scheduler = make_scheduler(store, registry, evidence=evidence)
    claim = await claim_next(scheduler)
    handoff = await scheduler.loop.driver.drive(claim, scheduler_signal())
    assert isinstance(handoff, FailureHandoff) and not handoff.in_flight
    lost = _lose_ack_once(store, "commit failed")
    result = await scheduler.loop.lifecycle.commit(handoff)
    assert lost and result.replayed and result.outcome is ExecutedOutcome.FAILED
    again = await scheduler.loop.lifecycle.commit(handoff)
    assert again.replayed and again.result == result.result and evidence.calls == 1
    stored = await api.get_result(TENANT, run.run_id)
    assert stored is not None and stored.failure == {"reason": "refused by policy"}
    with pytest.raises(StaleFenceError):
        await scheduler.loop.lifecycle.commit(FailureHandoff(claim, uuid.uuid4(), handoff.step, "other", None))


@pytest.mark.req("AGT-9", "AGT-8")
async def test_lost_ack_cancellation_replays_exactly(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    run = await api.submit(TENANT, "chain", "1", {"count": 0})
    await api.request_cancellation(TENANT, run.run_id)
    evidence = CountingEvidence()
    scheduler = make_scheduler(store, registry, evidence=evidence)
    claim = await claim_next(scheduler)
    handoff = await scheduler.loop.driver.drive(claim, scheduler_signal())
    assert isinstance(handoff, CancellationHandoff)
    lost = _lose_ack_once(store, "commit cancelled")
    result = await scheduler.loop.lifecycle.commit(handoff)
    assert lost and result.replayed and result.outcome is ExecutedOutcome.CANCELLED
    again = await scheduler.loop.lifecycle.commit(handoff)
    assert again.replayed and again.usage == result.usage and evidence.calls == 1
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "cancelled" and view.finished_at is not None
    [event] = await fetch(
        store, "SELECT * FROM adx_agent_events WHERE run_id = %s AND kind = 'cancellation_confirmed'", run.run_id
    )
    assert event["schema_id"] == "https://stknot.com/schemas/runtime/agent-cancellation-event/1.0.0"
    assert "count" not in str(event["payload"])  # public-safe: no request content


class TamperingEvidence(GraphLifecycleEvidenceProvider):
    """Real evidence with one fact altered, as an application provider with a bug would return it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def recover(self, store: AgentStore, request: EvidenceRequest) -> LifecycleEvidence:
        ev = await super().recover(store, request)
        if self.mode == "raise":
            raise EvidenceError("artifact store unreachable")
        if self.mode == "artifact":
            return LifecycleEvidence(**{**_fields(ev), "artifact": {"count": -1}})
        if self.mode == "request":
            return LifecycleEvidence(**{**_fields(ev), "request": {"input": {"count": 99}}})
        if self.mode == "usage":
            return LifecycleEvidence(**{**_fields(ev), "usage": {**ev.usage, "node_commits": 0}})
        return ev


def _fields(ev: LifecycleEvidence) -> dict[str, Any]:
    return {f: getattr(ev, f) for f in ev.__dataclass_fields__}


@pytest.mark.req("AGT-4")
@pytest.mark.parametrize("mode", ["raise", "artifact", "request", "usage"])
async def test_evidence_errors_never_partially_finalize(
    store: AgentStore, registry: Any, api: AgentRuns, mode: str
) -> None:
    """AGT-4: an evidence error releases the exact fence; no result, no terminal checkpoint, no status change."""
    run = await api.submit(TENANT, "chain", "1", {"count": 0})
    bad = make_scheduler(store, registry, evidence=TamperingEvidence(mode))
    report = await bad.tick()
    assert report.executed is ExecutedOutcome.RECOVERY_RELEASED, report
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "queued" and not view.leased and view.fence == 1
    assert await api.get_result(TENANT, run.run_id) is None
    terminal = await fetch(
        store, "SELECT 1 FROM adx_agent_checkpoints WHERE run_id = %s AND kind = 'terminal'", run.run_id
    )
    assert terminal == []
    effects = await fetch(store, "SELECT count(*) AS n FROM agent_effects WHERE run_id = %s", run.run_id)
    # A good provider later finishes from the terminal-ready checkpoint without re-running any node.
    good = make_scheduler(store, registry)
    report = await good.tick()
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    assert (await fetch(store, "SELECT count(*) AS n FROM agent_effects WHERE run_id = %s", run.run_id)) == effects
    assert effects[0]["n"] == 10


@pytest.mark.req("AGT-3")
async def test_missing_usage_is_never_zero_filled(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    run = await api.submit(TENANT, "thinker", "1", {"provider": "silent"})
    # Default lifecycle options: a run released on an evidence error is retried after a pause, at the back.
    scheduler = make_scheduler(store, registry, lifecycle=DurableGraphLifecycleOptions())
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.RECOVERY_RELEASED
    assert report.lifecycle is not None and "refusing to report zero" in (report.lifecycle.reason or "")
    assert await api.get_result(TENANT, run.run_id) is None
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "queued" and view.usage["model_calls"] == 1

    metered = await api.submit(TENANT, "thinker", "1", {"provider": "metered"})
    for _ in range(3):
        report = await scheduler.tick()
        if report.run_id == metered.run_id:
            break
    assert report.executed is ExecutedOutcome.SUCCEEDED, report
    result = await api.get_result(TENANT, metered.run_id)
    assert result is not None and result.artifact == {"text": "ab"}
    assert result.usage == {"input_tokens": 7, "output_tokens": 2, "model_calls": 1, "tool_calls": 0, "node_commits": 1}


@pytest.mark.req("AGT-8")
async def test_cancellation_without_evidence_stays_requested(store: AgentStore, registry: Any, api: AgentRuns) -> None:
    run = await api.submit(TENANT, "approval", "1", {})
    scheduler = make_scheduler(store, registry)
    assert (await scheduler.tick()).executed is ExecutedOutcome.WAITING
    view = await api.request_cancellation(TENANT, run.run_id)
    assert view.cancel_requested and view.status == "waiting"
    bad = make_scheduler(store, registry, evidence=TamperingEvidence("raise"))
    assert (await bad.tick()).executed is ExecutedOutcome.RECOVERY_RELEASED
    view = await api.get_run(TENANT, run.run_id)
    assert view.cancel_requested and view.status == "queued" and await api.get_result(TENANT, run.run_id) is None
    report = await scheduler.tick()
    assert report.executed is ExecutedOutcome.CANCELLED, report
    result = await api.get_result(TENANT, run.run_id)
    assert result is not None and result.status == "cancelled" and result.usage["node_commits"] == 1


def _unused() -> None:
    _ = standard_schemas
