"""Child runs and joins for the agent tests (a worker subprocess imports it: ``registrations = "agents_childapp"``).

``kid``: ``mode`` ok (returns ``value * 2``), fail (fails) or hold (waits on interrupt ``release``, so it stays
live until resolved or cancelled). ``family``: spawns one ``kid`` per entry of ``kids`` and joins them with
``policy``; its artifact lists each child's status and artifact in spawn order.
"""

from __future__ import annotations

from typing import Any

from agents_helpers import standard_schemas

from adx.agents import (
    ExecutableGraphRegistry,
    ExecutableGraphRegistryBuilder,
    Fail,
    Interrupt,
    Join,
    JoinPolicy,
    JsonSchemaRegistryBuilder,
    Next,
    NodeContext,
    NodeWaits,
    WaitKind,
)

OBJECT = "urn:adx-test:schema:family-object:1.0.0"


def register_schemas(schemas: JsonSchemaRegistryBuilder) -> None:
    schemas.register(OBJECT, {"type": "object"})


async def _kid(ctx: NodeContext, state: dict[str, Any]) -> Next | NodeWaits | Fail:
    if state["mode"] == "fail":
        return Fail(f"kid {state['value']} failed")
    if state["mode"] == "hold" and not any(w.resolved for w in ctx.wake or []):
        return NodeWaits((Interrupt("release"),))
    return Next(update={"doubled": state["value"] * 2})


async def _fan_out(ctx: NodeContext, state: dict[str, Any]) -> Next | NodeWaits:
    for wake in ctx.wake or []:
        if wake.kind is WaitKind.JOIN and wake.resolved:
            results = [{"status": c.status.value, "artifact": c.artifact, "graph": c.graph} for c in wake.children]
            return Next(update={"results": results})
    # First visit: spawn, then join. (On resume the join's wake is there, so nothing is spawned twice.)
    children = [await ctx.spawn("kid", kid) for kid in state["kids"]]
    return NodeWaits((Join("kids", tuple(children), JoinPolicy(state.get("policy", "all"))),))


def register_graphs(executables: ExecutableGraphRegistryBuilder) -> None:
    kid = executables.graph("kid", "1", entry="work", input_schema=OBJECT, output_schema=OBJECT)
    kid.node("work", _kid)
    kid.edge("work", "__end__")
    kid.terminal(lambda state: {"doubled": state.get("doubled")})
    family = executables.graph("family", "1", entry="fan_out", input_schema=OBJECT, output_schema=OBJECT)
    family.node("fan_out", _fan_out)
    family.edge("fan_out", "__end__")
    family.terminal(lambda state: {"results": state["results"]})


async def _spawn_then_crash(ctx: NodeContext, state: dict[str, Any]) -> Next | NodeWaits:
    for wake in ctx.wake or []:
        if wake.kind is WaitKind.JOIN and wake.resolved:
            return Next(update={"results": [{"status": c.status.value} for c in wake.children]})
    first = await ctx.spawn("kid", {"value": 1, "mode": "ok"})
    second = await ctx.spawn("kid", {"value": 2, "mode": "ok"}, key="second")
    if ctx.attempt == 1:  # the node dies after spawning, before its wait committed
        raise RuntimeError("crash after spawn")
    return NodeWaits((Join("kids", (first, second)),))


def register_crashing(executables: ExecutableGraphRegistryBuilder) -> None:
    g = executables.graph("crashing_family", "1", entry="fan_out", input_schema=OBJECT, output_schema=OBJECT)
    g.node("fan_out", _spawn_then_crash)
    g.edge("fan_out", "__end__")
    g.terminal(lambda state: {"results": state["results"]})


def build() -> ExecutableGraphRegistry:
    schemas = standard_schemas()
    register_schemas(schemas)
    executables = ExecutableGraphRegistryBuilder(schemas.build())
    register_graphs(executables)
    register_crashing(executables)
    return executables.build()
