"""``adx coordinator``: the cluster's placement and ownership authority."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import GlobalOptions, app, fail, setup_logging
from adx.cli._cluster import ClusterInfo, fill_from_cluster, log_joined
from adx.config import CoordinatorConfig, load_model
from adx.errors import AdxError

# A hand-started Coordinator joins the recorded `adx up` cluster (a second replica on its Redis, docs/
# high-availability.md) when its config is silent.
_FROM_CLUSTER: dict[str, Callable[[ClusterInfo], object]] = {
    "redis_url": lambda c: c.redis_url,
    "certs_dir": lambda c: c.certs_dir,
}


@app.command()
def coordinator(
    config: Annotated[Path | None, typer.Option("--config", help="TOML file (component 'coordinator')")] = None,
) -> None:
    """Run the Coordinator (gRPC with mutual TLS; state in Redis)."""
    from adx.coordinator._daemon import run_coordinator

    try:
        cfg, cluster = fill_from_cluster(
            load_model(CoordinatorConfig, "coordinator", config), _FROM_CLUSTER, GlobalOptions.cluster
        )
    except AdxError as exc:
        fail(exc)
    setup_logging("coordinator", cfg.logging.level, cfg.logging.format)
    log_joined(cluster)
    try:
        asyncio.run(run_coordinator(cfg))
    except AdxError as exc:
        fail(exc)
