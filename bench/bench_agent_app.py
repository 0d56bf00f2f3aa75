"""Registrations for the agent recovery benchmark's worker processes (``registrations = "bench_agent_app"``).

``slow``: ten nodes, each sleeping ``sleep_ms``; every node execution is logged with its fence in
``bench_node_runs`` (outside the commit) so the benchmark sees when a new owner continues a run.
``noop10``: ten no-op nodes (the throughput graph of bench_agents.py, for bench_agents_scale.py's processes).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

from adx.agents import ExecutableGraphRegistryBuilder, JsonSchemaRegistryBuilder, Next, NodeContext

ANY = "urn:adx-bench:schema:any:1.0.0"
DDL = "CREATE TABLE IF NOT EXISTS bench_node_runs (run_id uuid, node text, fence bigint, at timestamptz DEFAULT now())"


def register_schemas(schemas: JsonSchemaRegistryBuilder) -> None:
    schemas.register(ANY, {"type": "object"})


def _node(name: str) -> Any:
    async def node(ctx: NodeContext, state: dict[str, Any]) -> Next:
        async with await psycopg.AsyncConnection.connect(os.environ["BENCH_AGENT_DSN"], autocommit=True) as conn:
            await conn.execute(
                "INSERT INTO bench_node_runs (run_id, node, fence) VALUES (%s, %s, %s)", (ctx.run_id, name, ctx.fence)
            )
        await asyncio.sleep(state.get("sleep_ms", 0) / 1000)
        return Next(update={"n": state.get("n", 0) + 1})

    return node


def register_graphs(executables: ExecutableGraphRegistryBuilder) -> None:
    nodes = [f"n{i}" for i in range(10)]
    g = executables.graph("slow", "1", entry=nodes[0], input_schema=ANY, output_schema=ANY)
    for index, name in enumerate(nodes):
        g.node(name, _node(name)).edge(name, nodes[index + 1] if index + 1 < len(nodes) else "__end__")
    g.terminal(lambda state: {"n": state["n"]})

    async def noop(ctx: NodeContext, state: dict[str, Any]) -> Next:
        return Next(update={"i": state["i"] + 1})

    steps = [f"s{i}" for i in range(10)]
    noop10 = executables.graph("noop10", "1", entry=steps[0], input_schema=ANY, output_schema=ANY)
    for index, name in enumerate(steps):
        noop10.node(name, noop).edge(name, steps[index + 1] if index + 1 < len(steps) else "__end__")
    noop10.terminal(lambda state: {"i": state["i"]})
