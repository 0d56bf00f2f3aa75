"""Command-line parsing for the lean execd entry point (standard library only).

argparse (with gettext) is ~0.6 MiB of resident memory in every sandbox's PID 1, and sandboxd always passes the
same plain ``--option value`` argv. So :func:`options_from_args` reads that form itself from the one option
table below and imports argparse only for anything else (``--help``, an unknown or abbreviated option,
``--option=value``, a value that looks like an option, a bad value, a usage error): argparse then parses the
whole argv and writes its usual messages. Both paths read the same table, so they agree on every argv the fast
path accepts.
"""

from __future__ import annotations

import asyncio
import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn

from adx.execd import _http
from adx.execd._daemon import Execd, ExecdOptions
from adx.logs import configure_logging

if TYPE_CHECKING:
    import argparse

__all__ = ["build_parser", "main", "options_from_args"]

DESCRIPTION = "ADX execd: PID 1 of a sandbox; serves commands and files over HTTP on a Unix socket."


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


_FLAG = "flag"  # store_true
_APPEND = "append"  # repeatable, values in a list


def _options() -> list[tuple[str, Any, Any, str, dict[str, Any]]]:
    """(option, kind: a converter, ``str``, _FLAG or _APPEND, default, help, other add_argument keywords).

    A function, not a constant: the defaults read the environment and ``_http`` when the argv is parsed."""
    return [
        ("--socket", str, None, "client HTTP Unix socket to listen on (standalone use)", {}),
        (
            "--socket-fd",
            int,
            None,
            "inherited, already listening client socket (socket activation by sandboxd; replaces --socket)",
            {},
        ),
        ("--admin-socket", str, None, "privileged HTTP socket: activity and admission control", {}),
        ("--admin-socket-fd", int, None, "inherited, already listening admin socket", {}),
        ("--control-socket", str, None, "sandboxd's per-sandbox control socket to report to", {}),
        ("--sandbox-id", str, "", "identity sent in the control hello", {}),
        ("--execution-id", str, None, "execution identity sent in the control hello", {}),
        ("--socket-mode", _octal, 0o600, "mode of the sockets (default 600)", {}),
        ("--workload-cwd", str, None, "working directory of the workload", {}),
        ("--user", str, None, "run the workload and commands as this account of the image (name or uid)", {}),
        (
            "--keep-running-after-workload-exit",
            _FLAG,
            False,
            "by default execd (and so the sandbox) exits with the workload's status",
            {},
        ),
        ("--probe-command", str, None, "shell command; exit 0 = healthy", {}),
        ("--probe-tcp-port", int, None, "TCP port on 127.0.0.1 that must accept", {}),
        ("--probe-interval", _positive, 5.0, "seconds between probes", {}),
        ("--probe-timeout", _positive, 2.0, "seconds one probe may take", {}),
        ("--grace-seconds", float, 5.0, "SIGTERM -> SIGKILL grace at shutdown", {}),
        ("--ring-bytes", int, 1 << 20, "kept output per background stream", {}),
        ("--coalesce-seconds", float, 0.05, "min interval between activity reports", {}),
        (
            "--unset-env",
            _APPEND,
            [],
            "remove NAME from the workload's and commands' environment (repeatable)",
            {"metavar": "NAME"},
        ),
        (
            "--body-idle-timeout",
            _positive,
            _http.BODY_IDLE_TIMEOUT,
            "seconds a request body may stall before 408 (an abandoned upload is not activity forever)",
            {},
        ),
        (
            "--write-timeout",
            _positive,
            _http.WRITE_TIMEOUT,
            "seconds a client may read nothing of a response before it is dropped",
            {},
        ),
        ("--log-level", str, os.environ.get("ADX_LOG_LEVEL", "info"), "", {}),
        ("--log-format", str, os.environ.get("ADX_LOG_FORMAT", "kv"), "", {"choices": ("kv", "json")}),
    ]


def _dest(option: str) -> str:
    return option[2:].replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (``--help``, errors): imported here only, see the module docstring."""
    import argparse

    p = argparse.ArgumentParser(prog="execd", description=DESCRIPTION)
    for option, kind, default, help_text, extra in _options():
        if kind == _FLAG:
            p.add_argument(option, action="store_true", help=help_text)
        elif kind == _APPEND:
            p.add_argument(option, action="append", default=default, help=help_text, **extra)
        else:
            typed = {} if kind is str else {"type": kind}
            p.add_argument(option, default=default, help=help_text or None, **typed, **extra)
    p.add_argument("workload", nargs=argparse.REMAINDER, help="-- ARGV of the workload (optional)")
    return p


def _parse_plain(argv: list[str]) -> SimpleNamespace | None:
    """The argv as argparse would parse it, when it only has exact ``--option [value]`` pairs and then
    optionally ``-- WORKLOAD...``; None for anything else (argparse decides)."""
    options = _options()
    table = {option: (kind, extra) for option, kind, _, _, extra in options}
    args = SimpleNamespace(**{_dest(option): default for option, _, default, _, _ in options}, workload=[])
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            args.workload = argv[i:]  # argparse's REMAINDER keeps the "--"
            return args
        spec = table.get(arg)
        if spec is None:
            return None
        kind, extra = spec
        if kind == _FLAG:
            setattr(args, _dest(arg), True)
            i += 1
            continue
        if i + 1 == len(argv) or argv[i + 1].startswith("-"):
            return None
        text = argv[i + 1]
        if kind == _APPEND:
            getattr(args, _dest(arg)).append(text)
        else:
            try:
                value = kind(text)
            except Exception:  # argparse reports it
                return None
            if "choices" in extra and value not in extra["choices"]:
                return None
            setattr(args, _dest(arg), value)
        i += 2
    return args


def options_from_args(argv: list[str]) -> tuple[ExecdOptions, SimpleNamespace]:
    args = _parse_plain(argv)
    if args is None:
        args = SimpleNamespace(**vars(build_parser().parse_args(argv)))

    def error(message: str) -> NoReturn:
        build_parser().error(message)

    workload = list(args.workload)
    if workload and workload[0] == "--":
        workload = workload[1:]
    if (args.socket is None) == (args.socket_fd is None):
        error("give exactly one of --socket and --socket-fd")
    if args.admin_socket is not None and args.admin_socket_fd is not None:
        error("--admin-socket and --admin-socket-fd are mutually exclusive")
    if args.probe_command and args.probe_tcp_port is not None:
        error("--probe-command and --probe-tcp-port are mutually exclusive")
    if args.probe_tcp_port is not None and not 0 < args.probe_tcp_port < 65536:
        error("--probe-tcp-port must be in 1..65535")
    options = ExecdOptions(
        args.socket,
        socket_fd=args.socket_fd,
        admin_socket=args.admin_socket,
        admin_socket_fd=args.admin_socket_fd,
        control_socket=args.control_socket,
        sandbox_id=args.sandbox_id,
        execution_id=args.execution_id,
        socket_mode=args.socket_mode,
        workload=workload,
        workload_cwd=args.workload_cwd,
        exit_with_workload=not args.keep_running_after_workload_exit,
        probe_command=args.probe_command,
        probe_tcp_port=args.probe_tcp_port,
        probe_interval=args.probe_interval,
        probe_timeout=args.probe_timeout,
        grace_seconds=args.grace_seconds,
        ring_bytes=args.ring_bytes,
        coalesce_seconds=args.coalesce_seconds,
        unset_env=args.unset_env,
        user=args.user,
    )
    return options, args


def main(argv: list[str] | None = None) -> int:
    options, args = options_from_args(sys.argv[1:] if argv is None else argv)
    _http.BODY_IDLE_TIMEOUT = args.body_idle_timeout
    _http.WRITE_TIMEOUT = args.write_timeout
    configure_logging("execd", args.log_level, args.log_format)
    return asyncio.run(Execd(options).run())
