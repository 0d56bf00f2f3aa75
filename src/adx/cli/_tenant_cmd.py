"""``adx tenant create NAME``: a tenant API key, made by the Coordinator (talks to it with an api certificate)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app, console, err_console, fail
from adx.config import ApiConfig, load_model
from adx.errors import AdxError

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
    """Create tenant NAME (or add a key to it) and print its new API key (shown once; only its hash is kept)."""
    from adx.api import CoordinatorClient

    try:
        cfg = load_model(ApiConfig, "api", config)
        update: dict[str, object] = {}
        if coordinator is not None:
            update["coordinator"] = coordinator
        if certs_dir is not None:
            update["certs_dir"] = certs_dir
        cfg = ApiConfig.model_validate({**cfg.model_dump(), **update})

        async def make() -> str:
            client = CoordinatorClient.from_config(cfg)
            try:
                return await client.create_tenant(name)
            finally:
                await client.close()

        key = asyncio.run(make())
    except AdxError as exc:
        fail(exc)
    # The key alone on stdout (scripts capture it); the advice on stderr.
    console.print(key, soft_wrap=True, highlight=False, markup=False)
    err_console.print(f"tenant {name}: new API key (use it as ADX_API_KEY; it is not shown again)", highlight=False)
