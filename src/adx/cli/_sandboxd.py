"""``adx sandboxd --config FILE``: run the node-local sandbox daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app, fail, setup_logging
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
