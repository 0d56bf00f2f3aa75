"""``adx agent worker``: run a durable agent worker for one tenant."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app, console, fail, setup_logging
from adx.config import load_model
from adx.errors import AdxError

agent_app = typer.Typer(help="Durable agent runtime.", no_args_is_help=True)
app.add_typer(agent_app, name="agent")


@agent_app.command("worker")
def worker(
    config: Annotated[Path, typer.Option("--config", help="TOML file (component 'agent-worker')", dir_okay=False)],
) -> None:
    """Run an agent worker until SIGTERM/SIGINT; it drains, then exits."""
    from adx.agents._config import AgentWorkerConfig
    from adx.agents._deploy import run_worker

    try:
        cfg = load_model(AgentWorkerConfig, "agent-worker", config)
    except AdxError as exc:
        fail(exc)
    setup_logging("agent-worker", cfg.logging.level, cfg.logging.format)
    try:
        health = asyncio.run(run_worker(cfg))
    except AdxError as exc:
        fail(exc)
    console.print(f"agent worker stopped: ticks={health.ticks} executed={health.executed}")
