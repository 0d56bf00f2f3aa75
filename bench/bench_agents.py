"""Durable agent runtime throughput beside DBOS Transact on the same PostgreSQL, in the same run.

    uv run --group bench python bench/bench_agents.py [--runs 300] [--slots 8]

Figure: ADX runs of a 10-node no-op graph driven by an AgentWorker (fenced leases, one validated journal
event and one checkpoint per node, evidence-checked terminal commit): runs/s, node commits/s and the p50
latency of one node commit (its transaction). Baseline: DBOS Transact (``dbos``, bench-only dependency)
running a 10-step no-op workflow with the same concurrency, on the same PostgreSQL server: workflows/s,
steps/s and the p50 latency of one checkpointed step. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from _harness import emit, progress, summarize
from psycopg import sql

from adx.agents import (
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
    JsonSchemaRegistryBuilder,
    Next,
    NodeContext,
    register_standard_agent_cancellation_event_schema,
    register_standard_graph_driver_event_schema,
    register_standard_graph_lifecycle_event_schema,
)
from adx.config import PostgresServerConfig
from adx.embedded import EmbeddedPostgres

STEPS = 10
ANY = "urn:adx-bench:schema:any:1.0.0"


def registry() -> ExecutableGraphRegistry:
    schemas = JsonSchemaRegistryBuilder.with_default_limits()
    register_standard_graph_driver_event_schema(schemas)
    register_standard_graph_lifecycle_event_schema(schemas)
    register_standard_agent_cancellation_event_schema(schemas)
    schemas.register(ANY, {"type": "object"})
    ex = ExecutableGraphRegistryBuilder(schemas.build())

    async def noop(ctx: NodeContext, state: dict[str, Any]) -> Next:
        return Next(update={"i": state["i"] + 1})

    g = ex.graph("noop10", "1", entry="s0", input_schema=ANY, output_schema=ANY)
    for i in range(STEPS):
        g.node(f"s{i}", noop).edge(f"s{i}", f"s{i + 1}" if i + 1 < STEPS else "__end__")
    g.terminal(lambda s: {"i": s["i"]})
    return ex.build()


class TimedStore(AgentStore):
    """The real store, timing each node-commit transaction."""

    samples: list[float]

    async def commit_node(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await super().commit_node(*args, **kwargs)
        finally:
            self.samples.append(time.perf_counter() - start)


async def bench_adx(url: str, runs: int, slots: int, liveness_grace: float | None = 1.0) -> dict[str, Any]:
    store = await TimedStore.open(url, max_size=slots + 4)
    store.samples = []
    try:
        await store.ensure_tenant("bench")
        executables = registry()
        api = AgentRuns(store, executables)
        start = time.perf_counter()
        ids = [(await api.submit("bench", "noop10", "1", {"i": 0})).run_id for _ in range(runs)]
        admit_s = time.perf_counter() - start
        scheduler = DurableTenantScheduler(
            store,
            executables,
            GraphLifecycleEvidenceProvider(),
            DurableGraphDriverOptions(),
            DurableGraphLifecycleOptions(),
            DurableTenantSchedulerOptions(tenant_id="bench"),
        )

        async def ready() -> bool:
            return True

        start = time.perf_counter()
        worker = await AgentWorker.start(
            AgentWorkerBinding.tenant(scheduler),
            AgentWorkerReadiness(ready),
            AgentWorkerOptions(slots=slots, idle_poll_seconds=0.01, liveness_grace_seconds=liveness_grace),
        )
        async with store.connection("bench poll") as conn:
            while True:
                cur = await conn.execute(
                    "SELECT count(*) AS n FROM adx_agent_runs WHERE tenant_id = 'bench' AND status = 'succeeded'"
                )
                row = await cur.fetchone()
                if row and row["n"] == runs:
                    break
                await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - start
        await worker.shutdown()
        result = await api.get_result("bench", ids[-1])
        assert result is not None and result.artifact == {"i": STEPS}
        return {
            "runs": runs,
            "slots": slots,
            "seconds": round(elapsed, 3),
            "runs_per_s": round(runs / elapsed, 1),
            "node_commits_per_s": round(runs * STEPS / elapsed, 1),
            "node_commit_latency": summarize(store.samples),
            "admission_per_s": round(runs / admit_s, 1),
        }
    finally:
        await store.close()


async def bench_dbos(url: str, runs: int, slots: int) -> dict[str, Any]:
    from dbos import DBOS, DBOSConfig

    samples: list[float] = []

    @DBOS.step()
    async def noop(i: int) -> int:
        return i + 1

    @DBOS.workflow()
    async def workflow(i: int) -> int:
        for _ in range(STEPS):
            begin = time.perf_counter()
            i = await noop(i)
            samples.append(time.perf_counter() - begin)
        return i

    config: DBOSConfig = {"name": "adx-bench", "system_database_url": url, "run_admin_server": False}
    DBOS(config=config)
    DBOS.launch()
    try:
        pending = list(range(runs))
        start = time.perf_counter()

        async def slot() -> None:
            while pending:
                pending.pop()
                handle = await DBOS.start_workflow_async(workflow, 0)
                assert await handle.get_result() == STEPS

        await asyncio.gather(*(slot() for _ in range(slots)))
        elapsed = time.perf_counter() - start
    finally:
        DBOS.destroy()
    return {
        "runs": runs,
        "slots": slots,
        "seconds": round(elapsed, 3),
        "runs_per_s": round(runs / elapsed, 1),
        "steps_per_s": round(runs * STEPS / elapsed, 1),
        "step_latency": summarize(samples),
    }


def create_database(url: str, name: str) -> str:
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url.rsplit("/", 1)[0] + f"/{name}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--slots", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="adx-bench-agents-") as tmp:
        server = EmbeddedPostgres(Path(tmp), PostgresServerConfig())
        info = server.start()
        try:
            suffix = uuid.uuid4().hex[:8]
            adx_url = create_database(info.url, f"adx_{suffix}")
            dbos_url = create_database(info.url, f"dbos_{suffix}")
            progress(f"ADX: {args.runs} runs x {STEPS} nodes, {args.slots} slots")
            figure = asyncio.run(bench_adx(adx_url, args.runs, args.slots))
            progress(f"DBOS: {args.runs} workflows x {STEPS} steps, {args.slots} concurrent")
            baseline = asyncio.run(bench_dbos(dbos_url, args.runs, args.slots))
        finally:
            server.stop()
    emit(
        "agents",
        {
            "figure": {"adx_durable_runs": figure},
            "baseline": {"dbos_transact_workflows": baseline},
            "ratio": {
                "runs_per_s": round(figure["runs_per_s"] / baseline["runs_per_s"], 3),
                "node_commit_p50_vs_step_p50": round(
                    figure["node_commit_latency"]["p50_ms"] / baseline["step_latency"]["p50_ms"], 3
                ),
            },
            "notes": "same PostgreSQL 16 server (fsync on), same process, same concurrency; ADX additionally "
            "fences every write, validates each journal event against its frozen schema and re-checks "
            "evidence before the terminal commit",
        },
    )


if __name__ == "__main__":
    main()
