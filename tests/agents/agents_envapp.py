"""Test application of ``ctx.environment(...)`` (a worker subprocess imports it: ``registrations = "agents_envapp"``).

The ``sandbox`` graph: ``make`` creates the run's Environment ``box`` and writes a note into it; ``check`` reattaches
to ``box`` and reads the note back; with ``wait`` the run then waits for an approval (its Environments are paused
meanwhile) and ``after`` uses ``box`` again (which resumes it). Each node execution appends a line to
``$AGENTS_ENV_LOG``; a node blocks while the file ``$AGENTS_ENV_HOLD_DIR/<node>`` exists, after creating
``<node>.reached`` there, so a test can SIGKILL its worker at a known point.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from adx.agents import (
    EnvironmentSpec,
    ExecutableGraphRegistryBuilder,
    Interrupt,
    JsonSchemaRegistryBuilder,
    Next,
    NodeContext,
    NodeWaits,
)

SCHEMA = "urn:adx-test:schema:sandbox:1.0.0"
NOTE = "/work/note.txt"
SPEC = EnvironmentSpec(cpu=0.25, memory="256Mi")


def register_schemas(schemas: JsonSchemaRegistryBuilder) -> None:
    schemas.register(SCHEMA, {"type": "object"})


def _log(line: str) -> None:
    path = os.environ.get("AGENTS_ENV_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


async def _hold(node: str) -> None:
    directory = os.environ.get("AGENTS_ENV_HOLD_DIR")
    if not directory:
        return
    gate = Path(directory) / node
    if gate.exists():
        (Path(directory) / f"{node}.reached").touch()
    # The test SIGKILLs the worker here, then removes the gate (a file: another process) for the next one.
    while gate.exists():  # noqa: ASYNC110
        await asyncio.sleep(0.05)


async def make(ctx: NodeContext, state: dict[str, Any]) -> Next:
    env = await ctx.environment("box", SPEC)
    before = await env.commands.run(f"cat {NOTE} 2>/dev/null || echo absent")
    await env.files.write(NOTE, f"made by {ctx.run_id}\n")
    _log(f"make fence={ctx.fence} env={env.id} before={before.stdout.strip()!r}")
    await _hold("make")
    return Next(update={"env_id": env.id, "found_before": before.stdout.strip()})


async def check(ctx: NodeContext, state: dict[str, Any]) -> Next:
    await _hold("check")
    env = await ctx.environment("box")  # no spec: the run's Environment of that name, never a new one
    note = await env.files.read(NOTE)
    shown = await env.commands.run(["cat", NOTE])
    update: dict[str, Any] = {"note": note.decode(), "cat": shown.stdout, "check_env_id": env.id}
    if state.get("keep_spare"):
        spare = await ctx.environment("spare", SPEC, keep=True)
        update["spare_id"] = spare.id
    _log(f"check fence={ctx.fence} env={env.id}")
    return Next(update=update)


async def wait(ctx: NodeContext, state: dict[str, Any]) -> Next | NodeWaits:
    for wake in ctx.wake or []:
        if wake.wait_id == "approve" and wake.resolved:
            return Next(update={"approved": True})
    return NodeWaits((Interrupt("approve", {"env_id": state["env_id"]}),))


async def after(ctx: NodeContext, state: dict[str, Any]) -> Next:
    env = await ctx.environment("box")
    shown = await env.commands.run(["cat", NOTE])
    _log(f"after fence={ctx.fence} env={env.id}")
    return Next(update={"after_cat": shown.stdout, "after_env_id": env.id})


def register_graphs(executables: ExecutableGraphRegistryBuilder) -> None:
    g = executables.graph(
        "sandbox", "1", entry="make", input_schema=SCHEMA, output_schema=SCHEMA, interrupts=["approve"]
    )
    g.node("make", make).edge("make", "check")
    g.node("check", check).route("check", lambda s: "wait" if s.get("wait") else "__end__", ["wait", "__end__"])
    g.node("wait", wait).edge("wait", "after")
    g.node("after", after).edge("after", "__end__")
    g.terminal(lambda s: s)
