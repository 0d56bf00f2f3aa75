"""``adx api`` (public REST API, with the Ingress on the same port by default) and ``adx ingress`` (alone)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app
from adx.cli._daemon_cmd import COORDINATOR_CLIENT, run_daemon
from adx.gateway import ApiConfig


@app.command()
def api(
    config: Annotated[Path | None, typer.Option("--config", help="TOML file (component 'api')")] = None,
) -> None:
    """Run the API server (REST + OpenAPI at /openapi.json; the Ingress too unless ingress = false)."""
    from adx.api import serve

    run_daemon(ApiConfig, "api", config, lambda cfg: asyncio.run(serve(cfg)), COORDINATOR_CLIENT)


@app.command()
def ingress(
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML file (the 'api' model; overrides: ADX_INGRESS__<KEY>)")
    ] = None,
) -> None:
    """Run the Ingress alone: the data-plane routes (commands, files, ports) without the lifecycle API."""
    from adx.api import serve

    run_daemon(
        ApiConfig,
        "ingress",
        config,
        lambda cfg: asyncio.run(serve(cfg, api=False, ingress=True, component="ingress")),
        COORDINATOR_CLIENT,
    )
