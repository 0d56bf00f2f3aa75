"""``adx api`` (public REST API, with the Ingress on the same port by default) and ``adx ingress`` (alone)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import GlobalOptions, app, fail, setup_logging
from adx.cli._cluster import ClusterInfo, fill_from_cluster, log_joined
from adx.config import load_model
from adx.errors import AdxError
from adx.gateway import ApiConfig

# What a hand-started API server or Ingress takes from the recorded `adx up` cluster when its config is silent.
_FROM_CLUSTER: dict[str, Callable[[ClusterInfo], object]] = {
    "coordinator": lambda c: c.coordinator,
    "certs_dir": lambda c: c.certs_dir,
}


@app.command()
def api(
    config: Annotated[Path | None, typer.Option("--config", help="TOML file (component 'api')")] = None,
) -> None:
    """Run the API server (REST + OpenAPI at /openapi.json; the Ingress too unless ingress = false)."""
    from adx.api import serve

    try:
        cfg, cluster = fill_from_cluster(load_model(ApiConfig, "api", config), _FROM_CLUSTER, GlobalOptions.cluster)
    except AdxError as exc:
        fail(exc)
    setup_logging("api", cfg.logging.level, cfg.logging.format)
    log_joined(cluster)
    try:
        asyncio.run(serve(cfg))
    except AdxError as exc:
        fail(exc)


@app.command()
def ingress(
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML file (the 'api' model; overrides: ADX_INGRESS__<KEY>)")
    ] = None,
) -> None:
    """Run the Ingress alone: the data-plane routes (commands, files, ports) without the lifecycle API."""
    from adx.api import serve

    try:
        cfg, cluster = fill_from_cluster(load_model(ApiConfig, "ingress", config), _FROM_CLUSTER, GlobalOptions.cluster)
    except AdxError as exc:
        fail(exc)
    setup_logging("ingress", cfg.logging.level, cfg.logging.format)
    log_joined(cluster)
    try:
        asyncio.run(serve(cfg, api=False, ingress=True, component="ingress"))
    except AdxError as exc:
        fail(exc)
