"""The ``adx`` command line: one typer app; each subcommand lives in its own module."""

from __future__ import annotations

import sys
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from adx.errors import (
    AdxError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.logs import configure_logging

app = typer.Typer(
    name="adx",
    help="ADX: sandboxed Environments and durable agent runs for AI agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


def exit_codes() -> dict[type[AdxError], int]:
    """The one table of exit statuses (docs/cli.md): scripts tell "fix your input" from "try again later".
    An error takes the status of its most specific kind listed here (an authentication failure is a kind of
    invalid input with its own status); anything else ADX raises is 1, a usage error (typer) is 2."""
    from adx.sdk import AuthenticationError  # loaded only on this error path: the SDK pulls httpx

    return {
        AdxError: 1,
        InvalidInputError: 2,
        NotFoundError: 3,
        ConflictError: 4,
        UnavailableError: 5,
        UncertainOutcomeError: 6,
        AuthenticationError: 7,
    }


def exit_status(exc: AdxError) -> int:
    table = exit_codes()
    return next((table[kind] for kind in type(exc).__mro__ if kind in table), 1)


class GlobalOptions:
    log_level: str = "info"
    log_format: str = "kv"
    cluster: str | None = None  # --cluster / ADX_CLUSTER: which `adx up` cluster (default: the last started)


def fail(exc: AdxError) -> NoReturn:
    status = exit_status(exc)
    err_console.print(f"adx: error: {exc}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(status)


def setup_logging(component: str, level: str | None = None, fmt: str | None = None) -> None:
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


def main() -> None:
    # Importing the command modules registers them on ``app``.
    from adx.cli import (  # noqa: F401
        _agent,
        _api_cmd,
        _certs_cmd,
        _config_cmd,
        _coordinator_cmd,
        _env_cmd,
        _execd,
        _node_cmd,
        _sandboxd,
        _tenant_cmd,
        _up,
    )

    try:
        app()
    except AdxError as exc:  # pragma: no cover - commands translate their own errors via fail()
        try:
            fail(exc)
        except typer.Exit as done:
            sys.exit(done.exit_code)
