"""``adx tenant create NAME``: a tenant API key, made by the Coordinator (talks to it with an api certificate)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._admin import admin_config
from adx.cli._app import app, console, err_console, fail
from adx.errors import AdxError, UnavailableError

tenant_app = typer.Typer(help="Tenants and their API keys.", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")


@tenant_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="tenant name: 1-64 letters, digits, '-' or '_'")],
    coordinator: Annotated[
        str | None,
        typer.Option(
            "--coordinator",
            help="host:port of the Coordinator; several replicas: a:7401,b:7401 (default: the config's)",
        ),
    ] = None,
    certs_dir: Annotated[
        Path | None, typer.Option("--certs-dir", help="holds ca.pem and api-<name>.pem/.key", file_okay=False)
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML file of the API server ('api')")] = None,
) -> None:
    """Create tenant NAME (or add a key to it) and print its new API key (shown once; only its hash is kept).

    The Coordinator and certificates are those of the cluster `adx up` recorded, unless --coordinator,
    --certs-dir, --config (or ADX_API__COORDINATOR / ADX_API__CERTS_DIR) say otherwise."""
    from adx.gateway import CoordinatorClient

    try:
        cfg = admin_config(coordinator, certs_dir, config)

        async def make() -> str:
            client = CoordinatorClient.from_config(cfg.api)
            try:
                return await client.create_tenant(name)
            finally:
                await client.close()

        try:
            key = asyncio.run(make())
        except UnavailableError as exc:
            raise UnavailableError(f"{exc}; {cfg.reach_fix}", details=exc.details) from None
    except AdxError as exc:
        fail(exc)
    # The key alone on stdout (scripts capture it); the advice on stderr.
    console.print(key, soft_wrap=True, highlight=False, markup=False)
    err_console.print(f"tenant {name}: new API key (use it as ADX_API_KEY; it is not shown again)", highlight=False)
