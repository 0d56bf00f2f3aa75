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
    Interrupt,
    JsonSchemaRegistryBuilder,
    Next,
    NodeContext,
    NodeWaits,
    Reconciled,
    ToolCall,
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
    schemas.register(
        ORDER_INPUT,
        {"type": "object", "properties": {"amount": {"type": "integer", "minimum": 1}}, "required": ["amount"]},
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
    register_order(executables)


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


# --- the "order" graph: a non-idempotent charge, an approval wait, a receipt appended to a file ----------
#
# ``charge`` inserts a ledger row on its own connection (no unique key: calling it twice charges twice) and
# ``write_receipt`` appends a line to a file; both are non-idempotent and both have a reconcile hook that
# looks the call's idempotency key up where the effect lives. Each sleeps before and after its effect, so a
# SIGKILL lands in the unknown-outcome window often.

ORDER_INPUT = "urn:adx-test:schema:order-input:1.0.0"
LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS agent_ledger (idem_key text NOT NULL, run_id uuid NOT NULL, amount int NOT NULL);
CREATE TABLE IF NOT EXISTS agent_reconciles (tool text NOT NULL, idem_key text NOT NULL, outcome text NOT NULL);
"""


async def _pause(bound_ms: int) -> None:
    await asyncio.sleep(random.uniform(0, bound_ms) / 1000)


async def _db(query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(os.environ["AGENTS_TEST_DSN"], autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def charge(arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    await _pause(int(os.environ.get("AGENTS_TEST_TOOL_PAUSE_MS", "150")))
    await _db(
        "INSERT INTO agent_ledger (idem_key, run_id, amount) VALUES (%s, %s, %s)",
        (call.idempotency_key, call.run_id, arguments["amount"]),
    )
    await _pause(int(os.environ.get("AGENTS_TEST_TOOL_PAUSE_MS", "150")))
    return {"charge_id": call.idempotency_key}


async def reconcile_charge(arguments: dict[str, Any], call: ToolCall) -> Reconciled:
    found = await _db("SELECT idem_key FROM agent_ledger WHERE idem_key = %s", (call.idempotency_key,))
    decided = Reconciled.done({"charge_id": call.idempotency_key}) if found else Reconciled.not_done()
    await _db("INSERT INTO agent_reconciles VALUES ('charge', %s, %s)", (call.idempotency_key, decided.outcome.value))
    return decided


def _receipts() -> str:
    return os.environ["AGENTS_TEST_RECEIPTS"]


def _append(path: str, line: str) -> None:
    # One write() of one line with O_APPEND, then fsync: a line is either wholly in the file or not at all.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _has_key(path: str, key: str) -> bool:
    if not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as f:
        return any(line.split(" ", 1)[0] == key for line in f)


async def write_receipt(arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    await _pause(int(os.environ.get("AGENTS_TEST_TOOL_PAUSE_MS", "150")))
    await asyncio.to_thread(_append, _receipts(), f"{call.idempotency_key} {call.run_id} {arguments['amount']}\n")
    await _pause(int(os.environ.get("AGENTS_TEST_TOOL_PAUSE_MS", "150")))
    return {"receipt": call.idempotency_key}


async def reconcile_receipt(arguments: dict[str, Any], call: ToolCall) -> Reconciled:
    found = await asyncio.to_thread(_has_key, _receipts(), call.idempotency_key)
    decided = Reconciled.done({"receipt": call.idempotency_key}) if found else Reconciled.not_done()
    await _db("INSERT INTO agent_reconciles VALUES ('receipt', %s, %s)", (call.idempotency_key, decided.outcome.value))
    return decided


async def _charge_node(ctx: NodeContext, state: dict[str, Any]) -> Next:
    result = await ctx.tool("charge", {"amount": state["amount"]})
    return Next(update={"charge_id": result["charge_id"]})


async def _approval_node(ctx: NodeContext, state: dict[str, Any]) -> Next | NodeWaits:
    for wake in ctx.wake or []:
        if wake.wait_id == "approve" and wake.resolved:
            return Next(update={"approved_by": wake.resolution["by"]})
    return NodeWaits((Interrupt("approve", {"amount": state["amount"]}),))


async def _receipt_node(ctx: NodeContext, state: dict[str, Any]) -> Next:
    result = await ctx.tool("write_receipt", {"amount": state["amount"]})
    return Next(update={"receipt": result["receipt"]})


def register_order(executables: ExecutableGraphRegistryBuilder) -> None:
    executables.register_tool("charge", charge, idempotent=False, reconcile=reconcile_charge)
    executables.register_tool("write_receipt", write_receipt, idempotent=False, reconcile=reconcile_receipt)
    g = executables.graph(
        "order", "1", entry="charge", input_schema=ORDER_INPUT, output_schema=ORDER_INPUT, interrupts=["approve"]
    )
    g.node("charge", _charge_node).edge("charge", "approval")
    g.node("approval", _approval_node).edge("approval", "receipt")
    g.node("receipt", _receipt_node).edge("receipt", "__end__")
    g.terminal(lambda s: {k: s[k] for k in ("amount", "charge_id", "approved_by", "receipt")})
