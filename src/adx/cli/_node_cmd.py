"""``adx node``: the node agent (adxlet)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import GlobalOptions, app, fail, setup_logging
from adx.cli._cluster import ClusterInfo, fill_from_cluster, log_joined
from adx.config import NodeConfig, load_model
from adx.errors import AdxError


async def _run(config: NodeConfig) -> None:
    from adx.node import NodeAgent

    agent = NodeAgent(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stop_event.set)
    await agent.start()
    await agent.stop_event.wait()
    await agent.stop()


# A hand-started node joins the recorded `adx up` cluster when its config is silent (its certificate:
# `adx certs issue NAME`, which writes into the same directory).
_FROM_CLUSTER: dict[str, Callable[[ClusterInfo], object]] = {
    "coordinator": lambda c: c.coordinator,
    "certs_dir": lambda c: c.certs_dir,
}


@app.command()
def node(
    config: Annotated[Path, typer.Option("--config", help="TOML file (component 'node')", dir_okay=False)],
) -> None:
    """Run the node agent: Controllers for this node's Environments, the node API and the Relay."""
    try:
        cfg, cluster = fill_from_cluster(load_model(NodeConfig, "node", config), _FROM_CLUSTER, GlobalOptions.cluster)
    except AdxError as exc:
        fail(exc)
    setup_logging("node", cfg.logging.level, cfg.logging.format)
    log_joined(cluster)
    try:
        asyncio.run(_run(cfg))
    except AdxError as exc:
        fail(exc)
