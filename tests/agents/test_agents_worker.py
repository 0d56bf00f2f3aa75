"""AgentWorker: fixed slots, readiness gating, shutdown reclaim, wait() cancellation, health (AGT-13/14)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from agents_helpers import ANY_OBJECT, TENANT, build_registry, make_scheduler

from adx.agents import (
    AgentRuns,
    AgentStore,
    AgentWorker,
    AgentWorkerBinding,
    AgentWorkerOptions,
    AgentWorkerReadiness,
    ExecutableGraphRegistryBuilder,
    Next,
    NodeContext,
)
from adx.errors import ConflictError, InvalidInputError, UnavailableError


class Probe:
    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.hold = 0.15
        self.release = asyncio.Event()
        self.release.set()
        self.cancelled = 0
        self.entered = asyncio.Event()

    def register(self, ex: ExecutableGraphRegistryBuilder) -> None:
        async def busy(ctx: NodeContext, state: dict[str, Any]) -> Next:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.entered.set()
            try:
                await asyncio.sleep(self.hold)
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            finally:
                self.active -= 1
            return Next()

        g = ex.graph("busy", "1", entry="busy", input_schema=ANY_OBJECT, output_schema=ANY_OBJECT)
        g.node("busy", busy).edge("busy", "__end__").terminal(lambda s: {})


def ready() -> AgentWorkerReadiness:
    async def ok() -> bool:
        return True

    return AgentWorkerReadiness(ok, interval_seconds=0.05, ttl_seconds=1.0)


async def wait_until(predicate: Any, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture
def registry(probe: Probe) -> Any:
    return build_registry(probe.register)


async def _all_finished(api: AgentRuns, ids: list[Any]) -> bool:
    return all([(await api.get_run(TENANT, i)).finished for i in ids])


@pytest.mark.req("AGT-13", "AGT-17")
async def test_a_worker_never_runs_more_than_its_slots(store: AgentStore, registry: Any, probe: Probe) -> None:
    api = AgentRuns(store, registry)
    ids = [(await api.submit(TENANT, "busy", "1", {})).run_id for _ in range(9)]
    # Submission alone never starts anything (HTTP submission does not start a worker).
    assert [(await api.get_run(TENANT, i)).status for i in ids] == ["queued"] * 9
    scheduler = make_scheduler(store, registry)
    worker = await AgentWorker.start(
        AgentWorkerBinding.tenant(scheduler), ready(), AgentWorkerOptions(slots=3, idle_poll_seconds=0.02)
    )
    try:
        await wait_until(lambda: _all_finished(api, ids))
    finally:
        await worker.shutdown()
    assert probe.peak == 3
    with pytest.raises(ConflictError, match="already owned"):
        await AgentWorker.start(AgentWorkerBinding.tenant(scheduler), ready(), AgentWorkerOptions())
    health = worker.health()
    assert health.executed == {"succeeded": 9} and health.state == "stopped" and health.slots == 3


@pytest.mark.req("AGT-13")
async def test_readiness_is_mandatory_gates_ticks_and_checks_never_overlap(store: AgentStore, registry: Any) -> None:
    api = AgentRuns(store, registry)
    scheduler = make_scheduler(store, registry)
    binding = AgentWorkerBinding.tenant(scheduler)
    with pytest.raises(InvalidInputError, match="mandatory"):
        AgentWorker(binding, None, AgentWorkerOptions())  # type: ignore[arg-type]

    state = {"ok": False, "running": 0, "peak": 0, "checks": 0}

    async def check() -> bool:
        state["running"] += 1
        state["peak"] = max(state["peak"], state["running"])
        state["checks"] += 1
        await asyncio.sleep(0.03)  # slower than the interval would allow if checks could overlap
        state["running"] -= 1
        return bool(state["ok"])

    readiness = AgentWorkerReadiness(check, interval_seconds=0.01, ttl_seconds=0.2, timeout_seconds=1.0)
    with pytest.raises(UnavailableError, match="readiness"):
        await AgentWorker.start(binding, readiness, AgentWorkerOptions(slots=2, idle_poll_seconds=0.02))

    state["ok"] = True
    worker = await AgentWorker.start(binding, readiness, AgentWorkerOptions(slots=2, idle_poll_seconds=0.02))
    try:
        state["ok"] = False
        await asyncio.sleep(0.4)  # the last passing evidence expires (ttl 0.2 s)
        assert not worker.health().ready
        run = await api.submit(TENANT, "busy", "1", {})
        await asyncio.sleep(0.3)
        assert (await api.get_run(TENANT, run.run_id)).status == "queued"  # paused: no new ticks
        state["ok"] = True
        await wait_until(lambda: _all_finished(api, [run.run_id]))
    finally:
        await worker.shutdown()
    assert state["peak"] == 1 and state["checks"] > 10
    assert worker.health().readiness_failures > 0


@pytest.mark.req("AGT-13")
async def test_start_verifies_the_real_database_schema(store: AgentStore, registry: Any) -> None:
    scheduler = make_scheduler(store, registry)
    async with store.connection("tamper") as conn:
        await conn.execute("UPDATE adx_agent_migrations SET checksum = 'x' WHERE version = 1")
    with pytest.raises(UnavailableError, match="changed after it was applied"):
        await AgentWorker.start(AgentWorkerBinding.tenant(scheduler), ready(), AgentWorkerOptions())


@pytest.mark.req("AGT-13", "AGT-17")
async def test_shutdown_reclaims_ticks_and_node_tasks_within_the_drain(
    store: AgentStore, registry: Any, probe: Probe
) -> None:
    """Shutdown is neither run cancellation nor rollback: a stuck node is aborted, the run keeps its
    checkpoint and lease, and a later worker finishes it once the lease expires."""
    api = AgentRuns(store, registry)
    run = await api.submit(TENANT, "busy", "1", {})
    probe.release.clear()  # the node never finishes on its own
    from adx.agents import DurableGraphDriverOptions

    scheduler = make_scheduler(store, registry, driver=DurableGraphDriverOptions(lease_seconds=1.0))
    worker = await AgentWorker.start(
        AgentWorkerBinding.tenant(scheduler),
        ready(),
        AgentWorkerOptions(slots=2, drain_seconds=0.3, idle_poll_seconds=0.02),
    )
    await asyncio.wait_for(probe.entered.wait(), 10)
    started = time.monotonic()
    await worker.shutdown()
    assert time.monotonic() - started < 2.0
    assert probe.cancelled == 1 and probe.active == 0
    assert all(t.done() for t in worker._slots)
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "running" and not view.cancel_requested and view.checkpoint_seq == 0
    assert worker.health().state == "stopped"

    probe.release.set()
    rescuer = make_scheduler(store, registry)
    await asyncio.sleep(1.1)
    assert (await rescuer.tick()).executed is not None
    assert (await api.get_run(TENANT, run.run_id)).status == "succeeded"


@pytest.mark.req("AGT-13")
async def test_graceful_drain_yields_runs_at_a_node_boundary(store: AgentStore, registry: Any) -> None:
    api = AgentRuns(store, registry)
    run = await api.submit(TENANT, "chain", "1", {"count": 0, "delay_ms": 100})
    scheduler = make_scheduler(store, registry)
    worker = await AgentWorker.start(AgentWorkerBinding.tenant(scheduler), ready(), AgentWorkerOptions(slots=1))
    await wait_until(lambda: _checkpointed(api, run.run_id))
    await worker.shutdown()
    view = await api.get_run(TENANT, run.run_id)
    assert view.status == "queued" and not view.leased and 0 < view.checkpoint_seq < 10
    assert worker.health().executed == {"yielded": 1}


async def _checkpointed(api: AgentRuns, run_id: Any) -> bool:
    return (await api.get_run(TENANT, run_id)).checkpoint_seq >= 1


@pytest.mark.req("AGT-13", "AGT-14")
async def test_cancelling_wait_loses_nothing_and_health_has_no_request_content(
    store: AgentStore, registry: Any
) -> None:
    api = AgentRuns(store, registry)
    scheduler = make_scheduler(store, registry)
    worker = await AgentWorker.start(
        AgentWorkerBinding.tenant(scheduler), ready(), AgentWorkerOptions(slots=2, idle_poll_seconds=0.02)
    )
    waiter = asyncio.create_task(worker.wait())
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # The worker still owns its slots and keeps executing.
    run = await api.submit(TENANT, "busy", "1", {"secret": "hunter2-request-content"})
    await wait_until(lambda: _all_finished(api, [run.run_id]))
    health = worker.health()
    assert health.state == "running" and health.executed == {"succeeded": 1}
    assert health.ticks["executed"] == 1 and health.ticks["idle"] >= 1
    assert "hunter2" not in repr(health)
    done = asyncio.create_task(worker.wait())
    await worker.shutdown()
    await asyncio.wait_for(done, 5)
    assert worker.health().state == "stopped"
