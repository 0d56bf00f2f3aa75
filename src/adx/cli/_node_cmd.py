"""``adx node``: the node agent (adxlet)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app, fail, setup_logging
from adx.config import NodeConfig, load_model
from adx.errors import AdxError


async def _run(config: NodeConfig) -> None:
    from adx.node._agent import NodeAgent

    agent = NodeAgent(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stop_event.set)
    await agent.start()
    await agent.stop_event.wait()
    await agent.stop()


@app.command()
def node(
    config: Annotated[Path, typer.Option("--config", help="TOML file (component 'node')", dir_okay=False)],
) -> None:
    """Run the node agent: Controllers for this node's Environments, the node API and the Relay."""
    try:
        cfg = load_model(NodeConfig, "node", config)
    except AdxError as exc:
        fail(exc)
    setup_logging("node", cfg.logging.level, cfg.logging.format)
    try:
        asyncio.run(_run(cfg))
    except AdxError as exc:
        fail(exc)
