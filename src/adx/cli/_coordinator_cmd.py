"""``adx coordinator``: the cluster's placement and ownership authority."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app
from adx.cli._daemon_cmd import FromCluster, run_daemon
from adx.config import CoordinatorConfig

# A hand-started Coordinator joins the recorded `adx up` cluster (a second replica on its Redis, docs/
# high-availability.md) when its config is silent.
_FROM_CLUSTER: FromCluster = {
    "redis_url": lambda c: c.redis_url,
    "certs_dir": lambda c: c.certs_dir,
}


@app.command()
def coordinator(
    config: Annotated[Path | None, typer.Option("--config", help="TOML file (component 'coordinator')")] = None,
) -> None:
    """Run the Coordinator (gRPC with mutual TLS; state in Redis)."""
    from adx.coordinator._daemon import run_coordinator

    run_daemon(CoordinatorConfig, "coordinator", config, lambda cfg: asyncio.run(run_coordinator(cfg)), _FROM_CLUSTER)
