"""``adx sandboxd --config FILE``: run the node-local sandbox daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app, console, fail, setup_logging
from adx.config import load_model
from adx.errors import AdxError
from adx.sandboxd import SandboxdConfig


@app.command("sandboxd")
def sandboxd(
    config: Annotated[Path | None, typer.Option("--config", help="TOML configuration file", dir_okay=False)] = None,
) -> None:
    """Run sandboxd: process sandboxes on this node, with a private registry that survives restarts."""
    try:
        cfg = load_model(SandboxdConfig, "sandboxd", config)
    except AdxError as exc:
        fail(exc)
    setup_logging("sandboxd", cfg.logging.level, cfg.logging.format)
    from adx.sandboxd import run

    try:
        code = run(cfg)
    except AdxError as exc:
        fail(exc)
    raise typer.Exit(code)


image_app = typer.Typer(help="Sandbox images (the read-only lower layer every sandbox shares).", no_args_is_help=True)
app.add_typer(image_app, name="image")


@image_app.command("init")
def image_init(
    config: Annotated[Path | None, typer.Option("--config", help="sandboxd TOML configuration", dir_okay=False)] = None,
) -> None:
    """Build the default image once (sandboxd also builds it at start when missing); prints its path."""
    from adx.sandboxd._image import ensure_default_image

    try:
        cfg = load_model(SandboxdConfig, "sandboxd", config)
    except AdxError as exc:
        fail(exc)
    path = ensure_default_image(cfg.images_root)
    console.print(str(path), highlight=False)
