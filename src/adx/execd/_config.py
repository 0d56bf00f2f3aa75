"""Typed configuration of execd (component ``execd``), for ``adx execd --config FILE``.

Only the ``adx`` CLI imports this (pydantic); the in-sandbox process receives plain arguments instead, see
:func:`to_argv`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from adx.config._base import LoggingConfig, StrictModel

__all__ = ["ExecdConfig", "ProbeConfig", "to_argv"]


class ProbeConfig(StrictModel):
    """Health probe of the workload: exactly one of ``command`` (exit 0 = healthy) or ``tcp_port``."""

    command: str | None = Field(default=None, min_length=1, description="a shell command; exit 0 = healthy")
    tcp_port: int | None = Field(default=None, ge=1, le=65535, description="healthy when it accepts a connection")
    interval_seconds: float = Field(default=5.0, gt=0, le=3600, description="time between probes")
    timeout_seconds: float = Field(default=2.0, gt=0, le=3600, description="a probe slower than this failed")

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
    grace_seconds: float = Field(default=5.0, ge=0, le=3600, description="SIGTERM -> SIGKILL at shutdown")
    ring_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30, description="kept output per background stream")
    coalesce_seconds: float = Field(default=0.05, ge=0, le=60, description="min interval of activity reports")
    body_idle_timeout_seconds: float = Field(default=60.0, gt=0, le=86400, description="stalled request body -> 408")
    write_timeout_seconds: float = Field(default=300.0, gt=0, le=86400, description="client reading nothing -> drop")
    unset_env: list[str] = Field(
        default_factory=list, description="variables removed from the workload's and commands' environment"
    )
    python: str | None = Field(default=None, description="interpreter of the execd process (default: this one)")
    logging: LoggingConfig = LoggingConfig()


def to_argv(cfg: ExecdConfig) -> list[str]:
    """Arguments of ``python -m adx.execd`` equivalent to ``cfg``."""
    argv = ["--socket-mode", cfg.socket_mode]
    if cfg.socket_fd is not None:
        argv += ["--socket-fd", str(cfg.socket_fd)]
    else:
        argv += ["--socket", str(cfg.socket)]
    if cfg.admin_socket_fd is not None:
        argv += ["--admin-socket-fd", str(cfg.admin_socket_fd)]
    elif cfg.admin_socket is not None:
        argv += ["--admin-socket", str(cfg.admin_socket)]
    if cfg.control_socket is not None:
        argv += ["--control-socket", str(cfg.control_socket)]
    if cfg.sandbox_id:
        argv += ["--sandbox-id", cfg.sandbox_id]
    if cfg.execution_id is not None:
        argv += ["--execution-id", cfg.execution_id]
    if cfg.workload_cwd is not None:
        argv += ["--workload-cwd", cfg.workload_cwd]
    if not cfg.exit_with_workload:
        argv.append("--keep-running-after-workload-exit")
    if cfg.probe is not None:
        if cfg.probe.command is not None:
            argv += ["--probe-command", cfg.probe.command]
        else:
            argv += ["--probe-tcp-port", str(cfg.probe.tcp_port)]
        argv += ["--probe-interval", str(cfg.probe.interval_seconds), "--probe-timeout", str(cfg.probe.timeout_seconds)]
    argv += [
        "--grace-seconds", str(cfg.grace_seconds),
        "--ring-bytes", str(cfg.ring_bytes),
        "--coalesce-seconds", str(cfg.coalesce_seconds),
        "--body-idle-timeout", str(cfg.body_idle_timeout_seconds),
        "--write-timeout", str(cfg.write_timeout_seconds),
        "--log-level", cfg.logging.level,
        "--log-format", cfg.logging.format,
    ]  # fmt: skip
    for name in cfg.unset_env:
        argv += ["--unset-env", name]
    if cfg.workload:
        argv += ["--", *cfg.workload]
    return argv
