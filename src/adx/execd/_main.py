"""Command-line parsing for the lean execd entry point (argparse: standard library only)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from adx.execd import _http
from adx.execd._daemon import Execd, ExecdOptions
from adx.logs import configure_logging

__all__ = ["build_parser", "main", "options_from_args"]


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _octal(text: str) -> int:
    try:
        return int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an octal mode like 600, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="execd",
        description="ADX execd: PID 1 of a sandbox; serves commands and files over HTTP on a Unix socket.",
    )
    p.add_argument("--socket", help="client HTTP Unix socket to listen on (standalone use)")
    p.add_argument(
        "--socket-fd",
        type=int,
        default=None,
        help="inherited, already listening client socket (socket activation by sandboxd; replaces --socket)",
    )
    p.add_argument("--admin-socket", help="privileged HTTP socket: activity and admission control")
    p.add_argument("--admin-socket-fd", type=int, default=None, help="inherited, already listening admin socket")
    p.add_argument("--control-socket", help="sandboxd's per-sandbox control socket to report to")
    p.add_argument("--sandbox-id", default="", help="identity sent in the control hello")
    p.add_argument("--execution-id", default=None, help="execution identity sent in the control hello")
    p.add_argument("--socket-mode", type=_octal, default=0o600, help="mode of the sockets (default 600)")
    p.add_argument("--workload-cwd", default=None, help="working directory of the workload")
    p.add_argument(
        "--keep-running-after-workload-exit",
        action="store_true",
        help="by default execd (and so the sandbox) exits with the workload's status",
    )
    p.add_argument("--probe-command", default=None, help="shell command; exit 0 = healthy")
    p.add_argument("--probe-tcp-port", type=int, default=None, help="TCP port on 127.0.0.1 that must accept")
    p.add_argument("--probe-interval", type=_positive, default=5.0, help="seconds between probes")
    p.add_argument("--probe-timeout", type=_positive, default=2.0, help="seconds one probe may take")
    p.add_argument("--grace-seconds", type=float, default=5.0, help="SIGTERM -> SIGKILL grace at shutdown")
    p.add_argument("--ring-bytes", type=int, default=1 << 20, help="kept output per background stream")
    p.add_argument("--coalesce-seconds", type=float, default=0.05, help="min interval between activity reports")
    p.add_argument(
        "--unset-env",
        action="append",
        default=[],
        metavar="NAME",
        help="remove NAME from the workload's and commands' environment (repeatable)",
    )
    p.add_argument(
        "--body-idle-timeout",
        type=_positive,
        default=_http.BODY_IDLE_TIMEOUT,
        help="seconds a request body may stall before 408 (an abandoned upload is not activity forever)",
    )
    p.add_argument(
        "--write-timeout",
        type=_positive,
        default=_http.WRITE_TIMEOUT,
        help="seconds a client may read nothing of a response before it is dropped",
    )
    p.add_argument("--log-level", default=os.environ.get("ADX_LOG_LEVEL", "info"))
    p.add_argument("--log-format", default=os.environ.get("ADX_LOG_FORMAT", "kv"), choices=("kv", "json"))
    p.add_argument("workload", nargs=argparse.REMAINDER, help="-- ARGV of the workload (optional)")
    return p


def options_from_args(argv: list[str]) -> tuple[ExecdOptions, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    workload = list(args.workload)
    if workload and workload[0] == "--":
        workload = workload[1:]
    if (args.socket is None) == (args.socket_fd is None):
        parser.error("give exactly one of --socket and --socket-fd")
    if args.admin_socket is not None and args.admin_socket_fd is not None:
        parser.error("--admin-socket and --admin-socket-fd are mutually exclusive")
    if args.probe_command and args.probe_tcp_port is not None:
        parser.error("--probe-command and --probe-tcp-port are mutually exclusive")
    if args.probe_tcp_port is not None and not 0 < args.probe_tcp_port < 65536:
        parser.error("--probe-tcp-port must be in 1..65535")
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
    )
    return options, args


def main(argv: list[str] | None = None) -> int:
    options, args = options_from_args(sys.argv[1:] if argv is None else argv)
    _http.BODY_IDLE_TIMEOUT = args.body_idle_timeout
    _http.WRITE_TIMEOUT = args.write_timeout
    configure_logging("execd", args.log_level, args.log_format)
    return asyncio.run(Execd(options).run())
