"""execd's options, defined once: the typed record, its argv builder and its parser (standard library only).

Everything that starts execd says what it wants as an :class:`ExecdOptions` and turns it into argv with
:func:`to_argv` (sandboxd through :func:`adx.execd._launch.init_argv`, ``adx execd`` from its TOML config);
execd reads it back with :func:`parse_argv`. Both walk the one option table :data:`CLI`, so a field added to
the record without a command-line option fails ``tests/execd/test_options.py``, not a sandbox.

Why a ``NamedTuple`` and not a dataclass: ``dataclasses`` is an import (and ~0.1 MiB) that every sandbox's
PID 1 would pay for, while ``typing`` and ``collections`` are loaded by asyncio anyway; a NamedTuple is still a
typed, immutable record that mypy checks at every construction.

Why a hand-written parser in front of argparse: argparse (with gettext) is ~0.6 MiB of resident memory in every
sandbox's PID 1, and :func:`to_argv` always writes the same plain ``--option value`` form. So :func:`parse_argv`
reads that form itself and imports argparse only for anything else (``--help``, an unknown or abbreviated
option, ``--option=value``, a value that looks like an option, a bad value, a usage error): argparse then parses
the whole argv and writes its usual messages. Both read :data:`CLI`, so they agree on every argv the fast path
accepts.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, NoReturn

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

__all__ = ["CLI", "DESCRIPTION", "ExecdOptions", "build_parser", "parse_argv", "to_argv"]

DESCRIPTION = "ADX execd: PID 1 of a sandbox; serves commands and files over HTTP on a Unix socket."


class ExecdOptions(NamedTuple):
    """Everything execd is told at start (paths as seen by execd)."""

    socket: str | None = None  # standalone use; sandboxd hands a listening descriptor instead (socket_fd)
    socket_fd: int | None = None
    admin_socket: str | None = None
    admin_socket_fd: int | None = None
    control_socket: str | None = None
    sandbox_id: str = ""
    execution_id: str | None = None
    socket_mode: int = 0o600
    workload: tuple[str, ...] = ()
    workload_cwd: str | None = None
    user: str | None = None
    exit_with_workload: bool = True
    probe_command: str | None = None
    probe_tcp_port: int | None = None
    probe_interval: float = 5.0
    probe_timeout: float = 2.0
    grace_seconds: float = 5.0
    ring_bytes: int = 1 << 20
    coalesce_seconds: float = 0.05
    unset_env: tuple[str, ...] = ()
    body_idle_timeout: float = 60.0
    write_timeout: float = 300.0
    log_level: str = "info"  # at the default, not written by to_argv: execd's ADX_LOG_LEVEL then decides
    log_format: Literal["kv", "json"] = "kv"


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        import argparse

        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _octal(text: str) -> int:
    try:
        return int(text, 8)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"must be an octal mode like 600, got {text!r}") from None


#: A field's kind on the command line: how its text becomes a value (and back, see :func:`_text`).
_FLAG_OFF = "off"  # a flag that sets the (default True) field to False
_APPEND = "append"  # repeatable, one value per occurrence
_LOG_FORMATS = ("kv", "json")


class Option(NamedTuple):
    field: str
    kind: Callable[[str], Any] | str  # a converter, or _FLAG_OFF / _APPEND
    help: str
    named: str | None = None  # the flag where it is not derived from the field (``socket_fd``: ``--socket-fd``)

    @property
    def flag(self) -> str:
        return self.named or "--" + self.field.replace("_", "-")


#: Every field of ExecdOptions but ``workload`` (``-- ARGV...``), in the order argv is written.
CLI: tuple[Option, ...] = (
    Option("socket", str, "client HTTP Unix socket to listen on (standalone use)"),
    Option(
        "socket_fd",
        int,
        "inherited, already listening client socket (socket activation by sandboxd; replaces --socket)",
    ),
    Option("admin_socket", str, "privileged HTTP socket: activity and admission control"),
    Option("admin_socket_fd", int, "inherited, already listening admin socket"),
    Option("control_socket", str, "sandboxd's per-sandbox control socket to report to"),
    Option("sandbox_id", str, "identity sent in the control hello"),
    Option("execution_id", str, "execution identity sent in the control hello"),
    Option("socket_mode", _octal, "mode of the sockets (default 600)"),
    Option("workload_cwd", str, "working directory of the workload"),
    Option("user", str, "run the workload and commands as this account of the image (name or uid)"),
    Option(
        "exit_with_workload",
        _FLAG_OFF,
        "by default execd (and so the sandbox) exits with the workload's status",
        named="--keep-running-after-workload-exit",
    ),
    Option("probe_command", str, "shell command; exit 0 = healthy"),
    Option("probe_tcp_port", int, "TCP port on 127.0.0.1 that must accept"),
    Option("probe_interval", _positive, "seconds between probes"),
    Option("probe_timeout", _positive, "seconds one probe may take"),
    Option("grace_seconds", float, "SIGTERM -> SIGKILL grace at shutdown"),
    Option("ring_bytes", int, "kept output per background stream"),
    Option("coalesce_seconds", float, "min interval between activity reports"),
    Option("unset_env", _APPEND, "remove NAME from the workload's and commands' environment"),
    Option(
        "body_idle_timeout",
        _positive,
        "seconds a request body may stall before 408 (an abandoned upload is not activity forever)",
    ),
    Option("write_timeout", _positive, "seconds a client may read nothing of a response before it is dropped"),
    Option("log_level", str, "default: $ADX_LOG_LEVEL or info"),
    Option("log_format", str, "kv or json (default: $ADX_LOG_FORMAT or kv)"),
)


def _text(value: object) -> str:
    if isinstance(value, float):
        return repr(value)  # the shortest text that float() reads back exactly
    return str(value)


def to_argv(options: ExecdOptions) -> list[str]:
    """The arguments (after ``python -m adx.execd``) that :func:`parse_argv` reads back as ``options``.

    A field at its default is left out. A value that starts with ``-`` is written ``--option=value`` (which
    argparse reads as a value, not as another option)."""
    defaults = ExecdOptions._field_defaults
    argv: list[str] = []
    for option in CLI:
        value = getattr(options, option.field)
        if value == defaults[option.field]:
            continue
        if option.kind == _FLAG_OFF:
            argv.append(option.flag)
            continue
        values = value if option.kind == _APPEND else (value,)
        for item in values:
            text = format(item, "o") if option.kind is _octal else _text(item)
            argv += [f"{option.flag}={text}"] if text.startswith("-") else [option.flag, text]
    if options.workload:
        argv += ["--", *options.workload]
    return argv


def _defaults() -> dict[str, Any]:
    # Read when argv is parsed, not at import: the environment of the process that parses decides.
    return {
        **ExecdOptions._field_defaults,
        "log_level": os.environ.get("ADX_LOG_LEVEL", "info"),
        "log_format": os.environ.get("ADX_LOG_FORMAT", "kv"),
    }


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (``--help``, errors): imported here only, see the module docstring."""
    import argparse

    defaults = _defaults()
    p = argparse.ArgumentParser(prog="execd", description=DESCRIPTION)
    for option in CLI:
        if option.kind == _FLAG_OFF:
            p.add_argument(option.flag, dest=option.field, action="store_false", help=option.help)
        elif option.kind == _APPEND:
            p.add_argument(
                option.flag, dest=option.field, action="append", default=[], metavar="NAME", help=option.help
            )
        else:
            typed: dict[str, Any] = {} if option.kind is str else {"type": option.kind}
            if option.field == "log_format":
                typed["choices"] = _LOG_FORMATS
            p.add_argument(option.flag, dest=option.field, default=defaults[option.field], help=option.help, **typed)
    p.add_argument("workload", nargs=argparse.REMAINDER, help="-- ARGV of the workload (optional)")
    return p


def _parse_plain(argv: list[str]) -> dict[str, Any] | None:
    """The argv as argparse would parse it, when it only has exact ``--option [value]`` pairs and then
    optionally ``-- WORKLOAD...``; None for anything else (argparse decides)."""
    table = {option.flag: option for option in CLI}
    values = _defaults()
    appended: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            values["workload"] = argv[i:]  # argparse's REMAINDER keeps the "--"
            break
        option = table.get(arg)
        if option is None:
            return None
        if option.kind == _FLAG_OFF:
            values[option.field] = False
            i += 1
            continue
        if i + 1 == len(argv) or argv[i + 1].startswith("-"):
            return None
        text = argv[i + 1]
        if option.kind == _APPEND:
            appended.setdefault(option.field, []).append(text)
        else:
            assert callable(option.kind)
            try:
                value = option.kind(text)
            except Exception:  # argparse reports it
                return None
            if option.field == "log_format" and value not in _LOG_FORMATS:
                return None
            values[option.field] = value
        i += 2
    values.update(appended)
    return values


def parse_argv(argv: list[str]) -> ExecdOptions:
    """execd's options from its argv; a usage error exits with argparse's message (status 2)."""
    values = _parse_plain(argv)
    if values is None:
        values = vars(build_parser().parse_args(argv))

    def error(message: str) -> NoReturn:
        build_parser().error(message)

    workload = list(values.pop("workload", ()))
    if workload and workload[0] == "--":
        workload = workload[1:]
    options = ExecdOptions(**{**values, "workload": tuple(workload), "unset_env": tuple(values["unset_env"])})
    if (options.socket is None) == (options.socket_fd is None):
        error("give exactly one of --socket and --socket-fd")
    if options.admin_socket is not None and options.admin_socket_fd is not None:
        error("--admin-socket and --admin-socket-fd are mutually exclusive")
    if options.probe_command and options.probe_tcp_port is not None:
        error("--probe-command and --probe-tcp-port are mutually exclusive")
    if options.probe_tcp_port is not None and not 0 < options.probe_tcp_port < 65536:
        error("--probe-tcp-port must be in 1..65535")
    return options
