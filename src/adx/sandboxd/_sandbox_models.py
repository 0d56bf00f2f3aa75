"""A sandbox as sandboxd stores and names it: its resources, options, native identity, exit and record.

The base of every other sandboxd model module (``_models`` re-exports them all).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from adx.execd import _options as execd_options
from adx.execd._config import ProbeConfig
from adx.execd._launch import init_argv
from adx.model import NetworkPolicy
from adx.sandboxd._sandbox_layout import CONTROL_DIR_INSIDE, CONTROL_SOCKET, EXECD_ADMIN_SOCKET_FD, EXECD_SOCKET_FD
from adx.sandboxd._states import State

__all__ = [
    "LOG_GROUP_PATTERN",
    "SANDBOX_ID_RE",
    "TOKEN_PATTERN",
    "CallerToken",
    "ExecdOptions",
    "ExitStatus",
    "LogGroup",
    "NativeIdentity",
    "ProbeOptions",
    "Resources",
    "ResourcesSpec",
    "SandboxId",
    "SandboxRecord",
    "SandboxRef",
    "VolumeBinds",
    "WireModel",
]

SANDBOX_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def _sandbox_id(value: str) -> str:
    if not SANDBOX_ID_RE.match(value):
        raise ValueError("must match ^[a-z0-9][a-z0-9-]{0,62}$")
    return value


#: A sandbox ID as a caller names it (Create's chosen ID, Reclaim's).
SandboxId = Annotated[str, AfterValidator(_sandbox_id)]

#: A log group names a directory under ``<state_dir>/logs``: no separators, no dot files.
LOG_GROUP_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
LogGroup = Annotated[str | None, Field(pattern=LOG_GROUP_PATTERN)]


class WireModel(BaseModel):
    """Every sandboxd wire and storage model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ResourcesSpec(WireModel):
    cpu_millis: int | None = Field(default=None, ge=10, le=1_000_000)
    memory_bytes: int | None = Field(default=None, ge=8 << 20)
    pids_max: int | None = Field(default=None, ge=8, le=4_194_304)
    disk_bytes: int | None = Field(default=None, ge=0)


class Resources(WireModel):
    """Resolved resources of a sandbox (what is reserved and enforced)."""

    cpu_millis: int
    memory_bytes: int
    pids_max: int
    disk_bytes: int  # accounted against capacity; not enforced by overlayfs on ext4


#: execd's health probe of the workload, as execd's own configuration defines it (the same model).
ProbeOptions = ProbeConfig


class ExecdOptions(WireModel):
    """Run execd as the sandbox's PID 1; it starts ``CreateRequest.argv`` (if any) as the workload.

    sandboxd builds the init command line, mounts its execd runtime read-only at ``/opt/adx``, binds execd's
    client and admin sockets at host-only paths (``SandboxInfo.execd_socket`` / ``execd_admin_socket``) and
    hands PID 1 the listening descriptors; execd reports to sandboxd's runtime-control hub.
    """

    python: str = Field(default="python3", min_length=1, description="interpreter inside the sandbox")
    execution_id: str | None = Field(default=None, max_length=200, description="sent in execd's control hello")
    exit_with_workload: bool = Field(
        default=True, description="with a workload: execd (the sandbox) exits with it; else execd keeps serving"
    )
    probe: ProbeOptions | None = None
    grace_seconds: float = Field(default=5.0, ge=0, le=3600, description="SIGTERM -> SIGKILL at execd's exit")

    def init_argv(self, sandbox_id: str, workload: list[str], user: str | None) -> list[str]:
        """PID 1's argv: execd on the descriptors and control socket sandboxd prepares (``_sandbox_layout``)."""
        probe = self.probe
        options = execd_options.ExecdOptions(
            socket_fd=EXECD_SOCKET_FD,
            admin_socket_fd=EXECD_ADMIN_SOCKET_FD,
            control_socket=f"{CONTROL_DIR_INSIDE}/{CONTROL_SOCKET}",
            sandbox_id=sandbox_id,
            execution_id=self.execution_id,
            workload=tuple(workload),
            user=user,
            # without a workload there is nothing to exit with
            exit_with_workload=bool(workload) and self.exit_with_workload,
            probe_command=None if probe is None else probe.command,
            probe_tcp_port=None if probe is None else probe.tcp_port,
            probe_interval=5.0 if probe is None else probe.interval_seconds,
            probe_timeout=2.0 if probe is None else probe.timeout_seconds,
            grace_seconds=self.grace_seconds,
            unset_env=("PYTHONPATH",),  # execd's modules: not the workload's business
        )
        return init_argv(options, python=self.python)


class NativeIdentity(WireModel):
    """Written by the supervisor before the workload starts; binds the record to this boot's cgroup (SBX-5)."""

    boot_id: str
    cgroup_dev: int
    cgroup_ino: int
    cgroup_dir: str
    created_at: float


class ExitStatus(WireModel):
    exit_code: int | None = None
    signal: int | None = None
    oom_killed: bool = False
    oom_kills: int = 0
    setup_failed: bool = False
    finished_at: float | None = None
    boot_id: str | None = None
    known: bool = True  # False: the workload is gone but no supervisor recorded how it ended


def _check_volume_binds(value: dict[str, str]) -> dict[str, str]:
    for inside, host in value.items():
        if not inside.startswith("/") or inside == "/" or not host.startswith("/"):
            raise ValueError(f"{inside!r} -> {host!r}: both must be absolute paths (not / inside)")
    return value


#: Volumes bound read-write into a sandbox (its mount point inside -> the host directory), idmapped with a user
#: namespace so the files' on-disk IDs are the sandbox's own (docs/volumes.md).
VolumeBinds = Annotated[dict[str, str], AfterValidator(_check_volume_binds), Field(max_length=64)]


class SandboxRecord(WireModel):
    """One persisted sandbox (``sandboxes/<id>/record.json``, inside an owner envelope)."""

    sandbox_id: str
    generation: int
    token: str
    state: State
    request_id: str
    request_digest: str
    argv: list[str]
    init_argv: list[str]
    env: dict[str, str]
    cwd: str
    network: Literal["none", "host", "veth"]
    resources: Resources
    metadata: dict[str, str]
    created_at: float
    updated_at: float
    expires_at: float | None = None
    native: NativeIdentity | None = None
    exit: ExitStatus | None = None
    reason: str | None = None
    restored_from: str | None = None
    net_index: int | None = Field(default=None, description="veth mode: the /30 of the node's pool in use")
    net_policy: NetworkPolicy | None = Field(default=None, description="veth mode: the egress policy in force")
    native_name: str | None = Field(
        default=None,
        description="a claimed warm pool member: the name its cgroup, veth and nftables chain were made under and "
        "keep (cgroup v2 refuses renames); None: the sandbox ID",
    )
    id_base: int | None = Field(
        default=None, description="user namespace: host uid/gid of the sandbox's root (65536 IDs from there)"
    )
    execd: ExecdOptions | None = None
    reclaimed_at: float | None = Field(
        default=None, description="when the owner last replaced the token (Reclaim); the create's token is void"
    )
    log_group: str | None = Field(default=None, description="where the workload's output is kept; None: the ID")
    image: str | None = Field(default=None, description="the image name asked for (None: the node's default)")
    image_layers: list[str] | None = Field(
        default=None, description="the store layers mounted, bottom first (None: the host-derived skeleton)"
    )
    image_user: str | None = Field(default=None, description="execd runs commands and the workload as this user")
    volumes: VolumeBinds = Field(default_factory=dict, description="mount point inside -> host dir, read-write")


#: A sandbox's secret chosen by the caller of Create or Restore, so a lost reply leaves the sandbox addressable
#: (default: generated by sandboxd).
TOKEN_PATTERN = r"^[A-Za-z0-9_-]+$"
CallerToken = Annotated[str | None, Field(min_length=32, max_length=128, pattern=TOKEN_PATTERN)]


class SandboxRef(WireModel):
    """Names one sandbox in a per-sandbox call: all four must match (SBX-4)."""

    sandbox_id: str
    generation: int
    token: str
    owner: str | None = None
