"""``adx sandboxd --config FILE``: run the node-local sandbox daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app
from adx.cli._daemon_cmd import run_daemon
from adx.sandboxd import SandboxdConfig


@app.command("sandboxd")
def sandboxd(
    config: Annotated[Path | None, typer.Option("--config", help="TOML configuration file", dir_okay=False)] = None,
) -> None:
    """Run sandboxd: process sandboxes on this node, with a private registry that survives restarts."""
    from adx.sandboxd import run

    raise typer.Exit(run_daemon(SandboxdConfig, "sandboxd", config, run))
