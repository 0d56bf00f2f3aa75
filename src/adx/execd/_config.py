"""Typed configuration of execd (component ``execd``), for ``adx execd --config FILE``.

Only the ``adx`` CLI imports this (pydantic); the in-sandbox process receives plain arguments instead:
:func:`to_options` gives the one :class:`adx.execd._options.ExecdOptions`, which has the one argv builder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from adx.config._base import LoggingConfig, StrictModel
from adx.config._fields import seconds
from adx.execd._options import ExecdOptions

__all__ = ["ExecdConfig", "ProbeConfig", "to_options"]


# The one definition of execd's probe: ``adx execd``'s TOML takes it, and sandboxd's Create as ``ProbeOptions``.
class ProbeConfig(StrictModel):
    """Health probe of the workload: exactly one of ``command`` (exit 0 = healthy) or ``tcp_port``."""

    command: str | None = Field(
        default=None, min_length=1, max_length=4096, description="a shell command; exit 0 = healthy"
    )
    tcp_port: int | None = Field(default=None, ge=1, le=65535, description="healthy when it accepts a connection")
    interval_seconds: float = seconds(5.0, "time between probes", le=3600)
    timeout_seconds: float = seconds(2.0, "a probe slower than this failed", le=3600)

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if (self.command is None) == (self.tcp_port is None):
            raise ValueError("give exactly one of command or tcp_port")
        return self


class ExecdConfig(StrictModel):
    socket: Path = Field(default=Path("/run/adx/execd.sock"), description="client HTTP Unix socket")
    socket_fd: int | None = Field(
        default=None, ge=0, description="inherited listening client socket (socket activation; replaces socket)"
    )
    admin_socket: Path | None = Field(default=None, description="privileged socket: activity and admission")
    admin_socket_fd: int | None = Field(default=None, ge=0, description="inherited listening admin socket")
    control_socket: Path | None = Field(default=None, description="sandboxd's per-sandbox control socket")
    sandbox_id: str = Field(default="", description="the sandbox execd serves (reported to sandboxd)")
    execution_id: str | None = Field(default=None, description="the execution it runs, if sandboxd set one")
    socket_mode: str = Field(default="600", pattern=r"^[0-7]{3,4}$", description="octal mode of the sockets")
    workload: list[str] = Field(default_factory=list, description="argv of the Environment's entrypoint")
    workload_cwd: str | None = Field(default=None, description="working directory of the entrypoint")
    exit_with_workload: bool = Field(default=True, description="execd (the sandbox) exits with the workload")
    probe: ProbeConfig | None = Field(default=None, description="health probe of the entrypoint; unset: none")
    grace_seconds: float = seconds(5.0, "SIGTERM -> SIGKILL at shutdown", le=3600, ge=0)
    ring_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30, description="kept output per background stream")
    coalesce_seconds: float = seconds(0.05, "min interval of activity reports", le=60, ge=0)
    body_idle_timeout_seconds: float = seconds(60.0, "stalled request body -> 408", le=86400)
    write_timeout_seconds: float = seconds(300.0, "client reading nothing -> drop", le=86400)
    unset_env: list[str] = Field(
        default_factory=list, description="variables removed from the workload's and commands' environment"
    )
    python: str | None = Field(default=None, description="interpreter of the execd process (default: this one)")
    logging: LoggingConfig = LoggingConfig()


def to_options(cfg: ExecdConfig) -> ExecdOptions:
    """The execd options ``cfg`` describes (``adx execd`` turns them into argv with ``_launch.init_argv``)."""
    probe = cfg.probe
    return ExecdOptions(
        socket=None if cfg.socket_fd is not None else str(cfg.socket),
        socket_fd=cfg.socket_fd,
        admin_socket=None if cfg.admin_socket is None or cfg.admin_socket_fd is not None else str(cfg.admin_socket),
        admin_socket_fd=cfg.admin_socket_fd,
        control_socket=None if cfg.control_socket is None else str(cfg.control_socket),
        sandbox_id=cfg.sandbox_id,
        execution_id=cfg.execution_id,
        socket_mode=int(cfg.socket_mode, 8),
        workload=tuple(cfg.workload),
        workload_cwd=cfg.workload_cwd,
        exit_with_workload=cfg.exit_with_workload,
        probe_command=None if probe is None else probe.command,
        probe_tcp_port=None if probe is None else probe.tcp_port,
        probe_interval=5.0 if probe is None else probe.interval_seconds,
        probe_timeout=2.0 if probe is None else probe.timeout_seconds,
        grace_seconds=cfg.grace_seconds,
        ring_bytes=cfg.ring_bytes,
        coalesce_seconds=cfg.coalesce_seconds,
        unset_env=tuple(cfg.unset_env),
        body_idle_timeout=cfg.body_idle_timeout_seconds,
        write_timeout=cfg.write_timeout_seconds,
        log_level=cfg.logging.level,
        log_format=cfg.logging.format,
    )
