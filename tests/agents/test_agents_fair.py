"""AGT-12/13: the fair scheduler keeps ONE smooth weighted round robin sequence across replicas and crashes,
with the exact starvation bound; a worker refuses a fairness policy that differs from the persisted one."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
from pathlib import Path

import pytest
from agents_helpers import build_registry, fetch, make_scheduler
from agents_workers import kill, start_worker, stop, tail, wait_started

from adx.agents import (
    AgentRuns,
    AgentStore,
    AgentWorker,
    AgentWorkerBinding,
    AgentWorkerReadiness,
    DurableFairScheduler,
    DurableTenantSchedulerOptions,
    FairnessPolicy,
    TickOutcome,
    smooth_weighted_sequence,
    starvation_bound,
)
from adx.errors import ConflictError

WEIGHTS = {"t-a": 1, "t-b": 2, "t-c": 3}


def _replica(store: AgentStore, policy: FairnessPolicy) -> DurableFairScheduler:
    registry = build_registry()
    tenants = [
        make_scheduler(store, registry, options=DurableTenantSchedulerOptions(tenant_id=t)) for t in policy.weights
    ]
    return DurableFairScheduler(store, tenants, policy, idle_backoff_seconds=0.0)


async def _backlog(store: AgentStore, per_tenant: int) -> None:
    runs = AgentRuns(store, build_registry())
    for tenant in WEIGHTS:
        await store.ensure_tenant(tenant)
        for _ in range(per_tenant):
            await runs.submit(tenant, "chain", "1", {"count": 0})


def _max_gaps(sequence: list[str]) -> dict[str, int]:
    gaps = {}
    for tenant in WEIGHTS:
        positions = [i for i, t in enumerate(sequence) if t == tenant]
        gaps[tenant] = max(b - a for a, b in itertools.pairwise(positions))
    return gaps


def test_reference_sequence_and_bound() -> None:
    seq = smooth_weighted_sequence(WEIGHTS, 12)
    assert seq == ["t-c", "t-b", "t-a", "t-c", "t-b", "t-c"] * 2
    assert starvation_bound(WEIGHTS) == {"t-a": 6, "t-b": 3, "t-c": 3}


@pytest.mark.req("AGT-12", "AGT-17")
async def test_two_replicas_walk_one_sequence_with_the_exact_bound(store: AgentStore) -> None:
    policy = FairnessPolicy("triage", WEIGHTS)
    await _backlog(store, 30)  # every tenant stays backlogged for all 48 picks
    replicas = [_replica(store, policy) for _ in range(2)]
    for r in replicas:
        await r.verify_policy()

    async def ticker(replica: DurableFairScheduler) -> None:
        for _ in range(12):
            assert (await replica.tick()).outcome is TickOutcome.EXECUTED

    await asyncio.gather(*(ticker(r) for r in replicas for _ in range(2)))  # four concurrent tickers
    picks = await fetch(store, "SELECT seq, tenant_id, picked_by FROM adx_agent_fair_picks ORDER BY seq")
    sequence = [p["tenant_id"] for p in picks]
    assert [p["seq"] for p in picks] == list(range(1, 49))  # contiguous: one global sequence
    assert sequence == smooth_weighted_sequence(WEIGHTS, 48)
    assert len({p["picked_by"] for p in picks}) == 2  # both replicas reserved
    assert _max_gaps(sequence) == starvation_bound(WEIGHTS)
    done = await fetch(
        store, "SELECT tenant_id, count(*) AS n FROM adx_agent_runs WHERE status = 'succeeded' GROUP BY 1"
    )
    assert {r["tenant_id"]: r["n"] for r in done} == {"t-a": 8, "t-b": 16, "t-c": 24}


@pytest.mark.req("AGT-12")
async def test_an_idle_tenant_does_not_hold_the_others_back(store: AgentStore) -> None:
    policy = FairnessPolicy("idle", WEIGHTS)
    runs = AgentRuns(store, build_registry())
    for tenant in WEIGHTS:
        await store.ensure_tenant(tenant)
    for _ in range(3):
        await runs.submit("t-c", "chain", "1", {"count": 0})
    replica = _replica(store, policy)
    await replica.verify_policy()
    outcomes = [(await replica.tick()).outcome for _ in range(4)]
    assert outcomes == [TickOutcome.EXECUTED] * 3 + [TickOutcome.IDLE]
    # An all-idle round pauses reservations for the backoff: an idle worker does not burn the sequence.
    replica.idle_backoff_seconds = 30.0
    assert (await replica.tick()).outcome is TickOutcome.IDLE
    before = await fetch(store, "SELECT count(*) AS n FROM adx_agent_fair_picks")
    assert [(await replica.tick()).outcome for _ in range(5)] == [TickOutcome.IDLE] * 5
    assert await fetch(store, "SELECT count(*) AS n FROM adx_agent_fair_picks") == before


@pytest.mark.req("AGT-12", "AGT-13")
async def test_a_worker_refuses_a_different_persisted_policy(store: AgentStore) -> None:
    await _backlog(store, 0)
    first = _replica(store, FairnessPolicy("triage", WEIGHTS))
    worker = await AgentWorker.start(AgentWorkerBinding.fair(first), AgentWorkerReadiness.database(store))
    await worker.shutdown()
    other = _replica(store, FairnessPolicy("triage", {**WEIGHTS, "t-a": 2}))
    with pytest.raises(ConflictError, match="fairness policy 'triage' is persisted with weights"):
        await AgentWorker.start(AgentWorkerBinding.fair(other), AgentWorkerReadiness.database(store))


def _fair_config(path: Path, dsn: str, weights: dict[str, int]) -> Path:
    table = ", ".join(f'"{t}" = {w}' for t, w in weights.items())
    path.write_text(
        f'database_url = "{dsn}"\nregistrations = "agents_testapp"\nslots = 2\nidle_poll_seconds = 0.05\n'
        f'max_node_attempts = 100\ndrain_seconds = 5\n[fairness]\npolicy = "triage"\nweights = {{ {table} }}\n'
    )
    return path


@pytest.mark.slow
@pytest.mark.req("AGT-12", "AGT-13", "AGT-17")
async def test_fair_sequence_continues_across_a_sigkill_of_real_workers(
    store: AgentStore, postgres_dsn: str, tmp_path: Path
) -> None:
    await _backlog(store, 12)
    config = _fair_config(tmp_path / "fair.toml", postgres_dsn, WEIGHTS)
    log = tmp_path / "worker.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(2):
            procs.append(start_worker(config, postgres_dsn, log))
            await wait_started(procs[-1], log, n)

        async def picks() -> int:
            return int((await fetch(store, "SELECT count(*) AS n FROM adx_agent_fair_picks"))[0]["n"])

        deadline = time.monotonic() + 60
        while await picks() < 10:
            assert time.monotonic() < deadline, tail(log)
            await asyncio.sleep(0.02)
        await kill(procs.pop(0))
        procs.append(start_worker(config, postgres_dsn, log))
        await wait_started(procs[-1], log, 2)
        deadline = time.monotonic() + 120
        while (await fetch(store, "SELECT count(*) AS n FROM adx_agent_runs WHERE status <> 'succeeded'"))[0]["n"]:
            assert time.monotonic() < deadline, tail(log)
            await asyncio.sleep(0.1)
        # A different policy under the same name: the worker refuses to start.
        refused = tmp_path / "refused.log"
        bad = start_worker(
            _fair_config(tmp_path / "bad.toml", postgres_dsn, {**WEIGHTS, "t-a": 5}), postgres_dsn, refused
        )
        code = await asyncio.to_thread(bad.wait, 60)
        assert code != 0 and "fairness policy 'triage' is persisted" in tail(refused)
    finally:
        codes = [await stop(p) for p in procs]
    assert codes == [0] * len(codes), tail(log)
    rows = await fetch(store, "SELECT seq, tenant_id, picked_by FROM adx_agent_fair_picks ORDER BY seq")
    sequence = [r["tenant_id"] for r in rows]
    assert len({r["picked_by"] for r in rows}) >= 2 and len(rows) >= 36
    # One contiguous sequence across the kill, exactly the smooth weighted one; idle picks at the end included.
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert sequence == smooth_weighted_sequence(WEIGHTS, len(rows))
