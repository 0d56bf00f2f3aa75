"""``adx coordinator``: the cluster's placement and ownership authority."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app, fail, setup_logging
from adx.config import CoordinatorConfig, load_model
from adx.errors import AdxError


@app.command()
def coordinator(
    config: Annotated[Path | None, typer.Option("--config", help="TOML file (component 'coordinator')")] = None,
) -> None:
    """Run the Coordinator (gRPC with mutual TLS; state in Redis)."""
    from adx.coordinator._daemon import run_coordinator

    try:
        cfg = load_model(CoordinatorConfig, "coordinator", config)
    except AdxError as exc:
        fail(exc)
    setup_logging("coordinator", cfg.logging.level, cfg.logging.format)
    try:
        asyncio.run(run_coordinator(cfg))
    except AdxError as exc:
        fail(exc)
