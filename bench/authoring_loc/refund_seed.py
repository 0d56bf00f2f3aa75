"""The quickstart's refund workflow written with the seed's names only (for the lines-of-code comparison of
issue 15; bench/bench_authoring_loc.py). Same four steps, same side effect and approval as
examples/agents/agents_quickstart.py. The worker runs it with ``adx agent worker --config refund_seed.toml``
(registrations = "refund_seed", and PYTHONPATH pointing at this directory before the authoring layer)."""

import asyncio
import os
import sys
from pathlib import Path

from adx.agents import (
    END,
    AgentRuns,
    AgentStore,
    ExecutableGraphRegistryBuilder,
    Interrupt,
    JsonSchemaRegistryBuilder,
    Next,
    NodeWaits,
    Reconciled,
    ToolCall,
    register_standard_agent_cancellation_event_schema,
    register_standard_graph_driver_event_schema,
    register_standard_graph_lifecycle_event_schema,
)

PAYMENTS = Path(os.environ.get("REFUND_PAYMENTS", "payments.log"))
INPUT = "urn:acme:schema:refund-input:1.0.0"
OUTPUT = "urn:acme:schema:refund-output:1.0.0"


def register_schemas(schemas):
    schemas.register(
        INPUT,
        {
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
            "required": ["order_id", "amount"],
        },
    )
    schemas.register(
        OUTPUT,
        {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "amount": {"type": "integer"},
                "status": {"type": "string"},
                "approved_by": {"type": ["string", "null"]},
                "payment": {"type": ["string", "null"]},
            },
            "required": ["order_id", "amount", "status"],
        },
    )


def append_line(line):
    # One O_APPEND write, then fsync: a line is in the file whole or not at all.
    fd = os.open(PAYMENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def paid(key):
    lines = PAYMENTS.read_text().splitlines() if PAYMENTS.exists() else []
    return any(line.split(" ", 1)[0] == key for line in lines)


async def find_payment(args, call: ToolCall):
    if await asyncio.to_thread(paid, call.idempotency_key):
        return Reconciled.done({"payment": call.idempotency_key})
    return Reconciled.not_done()


async def pay(args, call: ToolCall):
    await asyncio.to_thread(append_line, f"{call.idempotency_key} {args['order_id']} {args['amount']}\n")
    return {"payment": call.idempotency_key}


async def check(ctx, state):
    if state["amount"] > 1000:
        return Next({"status": "rejected: over 1000"}, goto=END)
    return Next({"status": "checked"}, goto="approve")


async def approve(ctx, state):
    for wake in ctx.wake or []:
        if wake.wait_id == "approve" and wake.resolved:
            return Next({"approved_by": wake.resolution["by"]})
    return NodeWaits((Interrupt("approve", {"order_id": state["order_id"], "amount": state["amount"]}),))


async def pay_out(ctx, state):
    result = await ctx.tool("pay", {"order_id": state["order_id"], "amount": state["amount"]})
    return Next({"payment": result["payment"]})


async def finish(ctx, state):
    return Next({"status": "refunded"})


def register_graphs(executables):
    executables.register_tool("pay", pay, idempotent=False, reconcile=find_payment)
    g = executables.graph(
        "refund", "1", entry="check", input_schema=INPUT, output_schema=OUTPUT, interrupts=["approve"]
    )
    g.node("check", check).route("check", lambda state: "approve", ["approve", END])
    g.node("approve", approve).edge("approve", "pay_out")
    g.node("pay_out", pay_out).edge("pay_out", "finish")
    g.node("finish", finish).edge("finish", END)
    g.terminal(
        lambda s: {
            "order_id": s["order_id"],
            "amount": s["amount"],
            "status": s["status"],
            "approved_by": s.get("approved_by"),
            "payment": s.get("payment"),
        }
    )


def build_registry():
    # The submitter must build the same registry as the worker (the digests must match).
    schemas = JsonSchemaRegistryBuilder.with_default_limits()
    register_standard_graph_driver_event_schema(schemas)
    register_standard_graph_lifecycle_event_schema(schemas)
    register_standard_agent_cancellation_event_schema(schemas)
    register_schemas(schemas)
    executables = ExecutableGraphRegistryBuilder(schemas.build())
    register_graphs(executables)
    return executables.build()


async def main(dsn):
    store = await AgentStore.open(dsn, migrate=False)
    try:
        runs = AgentRuns(store, build_registry())
        await runs.create_tenant("default")
        run = await runs.submit("default", "refund", "1", {"order_id": "A-1001", "amount": 42})
        print("submitted", run.run_id)
        await runs.resolve("default", run.run_id, "approve", {"by": "ann"})
        result = await runs.wait("default", run.run_id, timeout=60)
        print(result.status, result.artifact)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
