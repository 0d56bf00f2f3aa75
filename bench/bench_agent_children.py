"""A parent with N child runs and a join, beside the same work as N sequential runs, in the same run.

    uv run --group bench python bench/bench_agent_children.py [--children 8] [--work-ms 200] [--rounds 3]

Figure: end-to-end seconds from submitting a ``parent`` run (its node spawns N ``child`` runs with
``ctx.spawn`` and waits on a ``Join``; each child's one node sleeps ``work_ms``, standing for I/O such as a
model or tool call) to its result, with one in-process AgentWorker (``--slots``) and one AgentMaintenance
(default 250 ms interval: it publishes the join). Baseline: the same N child runs submitted one after another,
each waited for before the next (what a caller without child runs does to keep the order), on the same worker.
Also printed: the same N runs submitted at once and all waited for (no parent, no join), which isolates what
the parent and the join publication add. Rounds alternate on one embedded PostgreSQL, fresh database each;
medians are reported. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _harness import emit, progress
from bench_agents import create_database

from adx.agents import (
    AgentMaintenance,
    AgentMaintenanceOptions,
    AgentRuns,
    AgentStore,
    AgentWorker,
    AgentWorkerBinding,
    AgentWorkerOptions,
    AgentWorkerReadiness,
    DurableGraphDriverOptions,
    DurableGraphLifecycleOptions,
    DurableTenantScheduler,
    DurableTenantSchedulerOptions,
    ExecutableGraphRegistry,
    ExecutableGraphRegistryBuilder,
    GraphLifecycleEvidenceProvider,
    Join,
    JsonSchemaRegistryBuilder,
    Next,
    NodeContext,
    NodeWaits,
    WaitKind,
    register_standard_agent_cancellation_event_schema,
    register_standard_graph_driver_event_schema,
    register_standard_graph_lifecycle_event_schema,
)
from adx.config import PostgresServerConfig
from adx.embedded import EmbeddedPostgres

ANY = "urn:adx-bench:schema:any:1.0.0"
TENANT = "bench"


async def _work(ctx: NodeContext, state: dict[str, Any]) -> Next:
    await asyncio.sleep(state["work_ms"] / 1000)
    return Next(update={"done": state["i"]})


async def _fan_out(ctx: NodeContext, state: dict[str, Any]) -> Next | NodeWaits:
    for wake in ctx.wake or []:
        if wake.kind is WaitKind.JOIN and wake.resolved:
            return Next(update={"done": [c.artifact["done"] for c in wake.children]})
    kids = [await ctx.spawn("child", {"i": i, "work_ms": state["work_ms"]}) for i in range(state["n"])]
    return NodeWaits((Join("kids", tuple(kids)),))


def registry() -> ExecutableGraphRegistry:
    schemas = JsonSchemaRegistryBuilder.with_default_limits()
    register_standard_graph_driver_event_schema(schemas)
    register_standard_graph_lifecycle_event_schema(schemas)
    register_standard_agent_cancellation_event_schema(schemas)
    schemas.register(ANY, {"type": "object"})
    executables = ExecutableGraphRegistryBuilder(schemas.build())
    child = executables.graph("child", "1", entry="work", input_schema=ANY, output_schema=ANY)
    child.node("work", _work).edge("work", "__end__")
    child.terminal(lambda state: {"done": state["done"]})
    parent = executables.graph("parent", "1", entry="fan_out", input_schema=ANY, output_schema=ANY)
    parent.node("fan_out", _fan_out).edge("fan_out", "__end__")
    parent.terminal(lambda state: {"done": state["done"]})
    return executables.build()


async def _round(url: str, n: int, work_ms: int, slots: int) -> dict[str, float]:
    store = await AgentStore.open(url, max_size=slots + 6)
    try:
        await store.ensure_tenant(TENANT)
        executables = registry()
        api = AgentRuns(store, executables)
        scheduler = DurableTenantScheduler(
            store,
            executables,
            GraphLifecycleEvidenceProvider(),
            DurableGraphDriverOptions(),
            DurableGraphLifecycleOptions(),
            DurableTenantSchedulerOptions(tenant_id=TENANT),
        )
        worker = await AgentWorker.start(
            AgentWorkerBinding.tenant(scheduler),
            AgentWorkerReadiness.database(store),
            AgentWorkerOptions(slots=slots, idle_poll_seconds=0.01),
        )
        maintenance = AgentMaintenance(store, [TENANT], AgentWorkerReadiness.database(store), AgentMaintenanceOptions())
        loop = asyncio.create_task(maintenance.run())
        try:
            start = time.perf_counter()
            parent = await api.submit(TENANT, "parent", "1", {"n": n, "work_ms": work_ms})
            result = await api.wait(TENANT, parent.run_id, timeout=300, poll_seconds=0.005)
            joined = time.perf_counter() - start
            assert result.artifact == {"done": list(range(n))}, result

            start = time.perf_counter()
            for i in range(n):
                run = await api.submit(TENANT, "child", "1", {"i": i, "work_ms": work_ms})
                await api.wait(TENANT, run.run_id, timeout=300, poll_seconds=0.005)
            sequential = time.perf_counter() - start

            start = time.perf_counter()
            ids = [(await api.submit(TENANT, "child", "1", {"i": i, "work_ms": work_ms})).run_id for i in range(n)]
            for run_id in ids:
                await api.wait(TENANT, run_id, timeout=300, poll_seconds=0.005)
            parallel = time.perf_counter() - start
        finally:
            maintenance.stop()
            await loop
            await worker.shutdown()
        return {"parent_join_s": joined, "sequential_s": sequential, "parallel_no_join_s": parallel}
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=8)
    parser.add_argument("--work-ms", type=int, default=200)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="adx-bench-children-") as tmp:
        server = EmbeddedPostgres(Path(tmp), PostgresServerConfig())
        info = server.start()
        try:
            for i in range(args.rounds):
                url = create_database(info.url, f"c_{uuid.uuid4().hex[:8]}")
                rows.append(asyncio.run(_round(url, args.children, args.work_ms, args.slots)))
                progress(f"round {i + 1}: " + ", ".join(f"{k}={v:.3f}" for k, v in rows[-1].items()))
        finally:
            server.stop()

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 3)

    figure, baseline = median("parent_join_s"), median("sequential_s")
    emit(
        "agent_children_join",
        {
            "figure": {
                "parent_with_children_and_join_s": figure,
                "all_rounds": [round(r["parent_join_s"], 3) for r in rows],
            },
            "baseline": {"sequential_runs_s": baseline, "all_rounds": [round(r["sequential_s"], 3) for r in rows]},
            "reference": {"parallel_runs_without_join_s": median("parallel_no_join_s")},
            "speedup_vs_sequential": round(baseline / figure, 2),
            "children": args.children,
            "work_ms": args.work_ms,
            "slots": args.slots,
            "rounds": args.rounds,
        },
    )


if __name__ == "__main__":
    main()
