"""Test application registrations (importable by a worker subprocess via ``registrations = "agents_testapp"``).

The ``chain`` graph has ten nodes; each node's side effect is one row in ``agent_effects`` written through
``ctx.on_commit`` (inside the node's commit transaction), and each *execution* of a node (committed or not)
is one row in ``agent_node_runs`` written on a separate connection, so tests can tell re-execution from
duplicated effects.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import psycopg

from adx.agents import (
    ExecutableGraphRegistryBuilder,
    JsonSchemaRegistryBuilder,
    Next,
    NodeContext,
)

INPUT = "urn:adx-test:schema:chain-input:1.0.0"
OUTPUT = "urn:adx-test:schema:chain-output:1.0.0"
CHAIN_NODES = [f"n{i}" for i in range(10)]

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS agent_effects (run_id uuid NOT NULL, node text NOT NULL, fence bigint NOT NULL);
CREATE TABLE IF NOT EXISTS agent_node_runs (run_id uuid NOT NULL, node text NOT NULL, fence bigint NOT NULL);
"""


def register_schemas(schemas: JsonSchemaRegistryBuilder) -> None:
    schemas.register(
        INPUT,
        {
            "type": "object",
            "properties": {"count": {"type": "integer"}, "delay_ms": {"type": "integer", "minimum": 0}},
            "required": ["count"],
            "additionalProperties": False,
        },
    )
    schemas.register(
        OUTPUT,
        {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
    )


def _chain_node(name: str) -> Any:
    async def node(ctx: NodeContext, state: dict[str, Any]) -> Next:
        dsn = os.environ.get("AGENTS_TEST_DSN")
        if dsn:
            # Every execution is logged outside the commit transaction (at-least-once by nature).
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute(
                    "INSERT INTO agent_node_runs (run_id, node, fence) VALUES (%s, %s, %s)",
                    (ctx.run_id, name, ctx.fence),
                )
        delay = state.get("delay_ms", 0)
        if delay:
            await asyncio.sleep(random.uniform(0, delay) / 1000)

        async def effect(conn: Any) -> None:
            await conn.execute(
                "INSERT INTO agent_effects (run_id, node, fence) VALUES (%s, %s, %s)", (ctx.run_id, name, ctx.fence)
            )

        ctx.on_commit(effect)
        return Next(update={"count": state["count"] + 1})

    return node


def register_graphs(executables: ExecutableGraphRegistryBuilder) -> None:
    g = executables.graph("chain", "1", entry=CHAIN_NODES[0], input_schema=INPUT, output_schema=OUTPUT)
    for index, name in enumerate(CHAIN_NODES):
        g.node(name, _chain_node(name))
        g.edge(name, CHAIN_NODES[index + 1] if index + 1 < len(CHAIN_NODES) else "__end__")
    g.terminal(lambda state: {"count": state["count"]})


class _RefusingEvidence:
    """Evidence that is never available (AGENTS_TEST_EVIDENCE=fail): runs stop at the terminal barrier."""

    async def recover(self, store: Any, request: Any) -> Any:
        from adx.agents import EvidenceError

        raise EvidenceError("evidence withheld by the test")


def evidence_provider() -> Any:
    from adx.agents import GraphLifecycleEvidenceProvider

    if os.environ.get("AGENTS_TEST_EVIDENCE") == "fail":
        return _RefusingEvidence()
    return GraphLifecycleEvidenceProvider()
