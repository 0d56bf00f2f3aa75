"""``adx execd``: validate the configuration, then exec the lean in-sandbox process.

The ``adx`` CLI loads typer, rich and pydantic (tens of MiB); execd's idle memory is paid by every sandbox, so
after validation this command replaces itself (``execv``, same PID, so it stays PID 1) with
``python -m adx.execd ...``, which imports only the standard library.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app
from adx.cli._output import failing, print_json
from adx.config import load_model
from adx.errors import InvalidInputError
from adx.execd._config import ExecdConfig, ProbeConfig, to_options
from adx.execd._launch import init_argv


@app.command(
    "execd",
    context_settings={"allow_extra_args": False, "ignore_unknown_options": False},
)
def execd(
    workload: Annotated[
        list[str] | None, typer.Argument(help="the workload's argv (after --); execd starts it and watches it")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML file (component 'execd')", dir_okay=False)
    ] = None,
    socket: Annotated[Path | None, typer.Option("--socket", help="client HTTP Unix socket")] = None,
    admin_socket: Annotated[Path | None, typer.Option("--admin-socket", help="activity/admission socket")] = None,
    control_socket: Annotated[
        Path | None, typer.Option("--control-socket", help="sandboxd's per-sandbox control socket")
    ] = None,
    sandbox_id: Annotated[str | None, typer.Option("--sandbox-id")] = None,
    execution_id: Annotated[str | None, typer.Option("--execution-id")] = None,
    probe_command: Annotated[str | None, typer.Option("--probe-command", help="shell command, 0 = healthy")] = None,
    probe_tcp_port: Annotated[int | None, typer.Option("--probe-tcp-port", help="workload TCP port")] = None,
    print_argv: Annotated[
        bool, typer.Option("--print-argv", help="print the execd process argv as JSON instead of running it")
    ] = False,
) -> None:
    """Run execd (PID 1 of a sandbox): commands, files and activity over HTTP on a Unix socket."""
    with failing():
        cfg = load_model(ExecdConfig, "execd", config)
        update: dict[str, object] = {
            key: value
            for key, value in (
                ("socket", socket),
                ("admin_socket", admin_socket),
                ("control_socket", control_socket),
                ("sandbox_id", sandbox_id),
                ("execution_id", execution_id),
            )
            if value is not None
        }
        if workload:
            update["workload"] = list(workload)
        if probe_command is not None or probe_tcp_port is not None:
            try:
                update["probe"] = ProbeConfig(command=probe_command, tcp_port=probe_tcp_port)
            except ValueError as exc:
                raise InvalidInputError("--probe-command/--probe-tcp-port", str(exc).splitlines()[-1]) from None
        cfg = cfg.model_copy(update=update)
    python = cfg.python or sys.executable
    argv = init_argv(to_options(cfg), python=python)
    if print_argv:
        print_json(argv)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, argv)
