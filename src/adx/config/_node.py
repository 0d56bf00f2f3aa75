"""Configuration of ``adx node`` (the adxlet)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from adx.config._base import LoggingConfig, StrictModel
from adx.config._fields import (
    METRICS_LISTEN_PATTERN,
    NAME_PATTERN,
    CoordinatorTargets,
    cpu_overcommit_ratio,
    fraction,
    seconds,
)


def _valid_for() -> Any:
    # Both resource sources: a sample is trusted this long.
    return seconds(30.0, "a capacity sample older than this is stale: the node then admits nothing new", le=86_400)


class AutoResourceSource(StrictModel):
    """RES-3: read this machine (cgroup-aware CPU and memory, free space on ``disk_path``)."""

    kind: Literal["auto"] = Field(default="auto", description="measure this machine")
    disk_path: Path = Field(default=Path("/"), description="the filesystem whose free space is the disk capacity")
    valid_for_seconds: float = _valid_for()


class SandboxdResourceSource(StrictModel):
    """RES-2: ask sandboxd's Resource call over its Unix socket, after a passing health call."""

    kind: Literal["sandboxd"] = Field(default="sandboxd", description="the node's sandboxd")
    socket: Path = Field(description="sandboxd's API socket")
    valid_for_seconds: float = _valid_for()


ResourceSource = Annotated[AutoResourceSource | SandboxdResourceSource, Field(discriminator="kind")]


class SandboxdRuntimeConfig(StrictModel):
    """The node's runtime: a local sandboxd (execd is each sandbox's PID 1, mounted from sandboxd's ro_binds)."""

    kind: Literal["sandboxd"] = Field(default="sandboxd", description="the node's sandboxd")
    socket: Path = Field(default=Path("/var/lib/adx/sandboxd/api/sandboxd.sock"), description="sandboxd's API socket")
    python: str = Field(default="python3", description="the interpreter inside sandboxes that runs execd")
    ready_timeout_seconds: float = seconds(60.0, "create -> execd answers", le=3600)
    volumes_dir: Path | None = Field(
        default=None,
        description="the volume root (the API's volumes_dir; shared storage when there is more than one node): "
        "Environments mount their tenant's volumes from it; unset: Environments with volumes fail to start",
    )
    bench_record_only: bool = Field(
        default=False,
        description="BENCH ONLY (bench/bench_control_plane.py): no sandboxd is used; executions are only "
        "recorded in the adxlet's memory and nothing runs. Never set it on a node that serves Environments",
    )


class CheckpointConfig(StrictModel):
    """Where this node publishes pause checkpoints (ENV-3). Names are sandboxd artifact roots
    (``checkpoint_dirs`` in sandboxd's config; ``local`` always exists)."""

    default_storage: Literal["local", "shared"] = Field(
        default="local", description="what pauseOptions.storage 'configured' means on this node"
    )
    shared_root: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the sandboxd artifact root on the cluster's shared storage (e.g. an NFS mount); "
        "unset: this node has no shared storage and refuses storage 'shared'",
    )

    @model_validator(mode="after")
    def _shared_default_needs_a_root(self) -> CheckpointConfig:
        if self.default_storage == "shared" and self.shared_root is None:
            raise ValueError("default_storage 'shared' needs shared_root")
        return self


class PressureConfig(StrictModel):
    """RES-7: memory and disk pressure thresholds (fractions in use). Either at its high mark closes admission of
    new Environments; both below their low marks reopen it; a failed read closes it. Running ones are untouched."""

    enabled: bool = Field(default=True, description="false: pressure never closes admission")
    memory_high: float = fraction(0.95, "memory in use (1 - MemAvailable/MemTotal)")
    memory_low: float = fraction(0.90, "memory in use at or below which admission reopens (with disk below disk_low)")
    disk_high: float = fraction(0.90, "blocks in use on the sandbox filesystem")
    disk_low: float = fraction(0.85, "disk in use at or below which admission reopens (with memory below memory_low)")
    meminfo_path: Path = Field(default=Path("/proc/meminfo"), description="where memory is read (meminfo format)")
    disk_path: Path | None = Field(
        default=None,
        description="a path on the filesystem to measure; unset: sandboxd's state directory (from its health)",
    )

    @model_validator(mode="after")
    def _low_below_high(self) -> PressureConfig:
        if self.memory_low > self.memory_high:
            raise ValueError("memory_low must not exceed memory_high")
        if self.disk_low > self.disk_high:
            raise ValueError("disk_low must not exceed disk_high")
        return self


class NodeConfig(StrictModel):
    name: str = Field(pattern=NAME_PATTERN, description="node name; must match its certificate")
    listen: str = Field(default="127.0.0.1:7402", description="gRPC for the Coordinator and API server")
    advertise_address: str = Field(default="", description="host:port others dial (default: listen)")
    relay_listen: str = Field(default="127.0.0.1:7403", description="the data-plane Relay")
    coordinator: CoordinatorTargets = Field(
        default="localhost:7401",
        description="host:port of the Coordinator; with several replicas (HA) a list, or one string "
        "'a:7401,b:7401' (dial it with adx._coordinator_channel.coordinator_channel)",
    )
    certs_dir: Path = Field(
        default=Path(".adx/certs"), description="holds ca.pem and node-<name>.pem/.key (adx certs issue)"
    )
    state_dir: Path = Field(
        default=Path(".adx/node"), description="the node's own files (its session, the degradation journal by default)"
    )
    report_interval_seconds: float = seconds(
        5.0, "how often the node heartbeats and reports capacity to the Coordinator", le=3600
    )
    rpc_timeout_seconds: float = seconds(5.0, "bound of each call to the Coordinator", le=600)
    runtime_ready_timeout_seconds: float = seconds(
        120.0, "how long one round of waiting for sandboxd's health lasts (rounds repeat until it answers)", le=3600
    )
    resource_source: ResourceSource | None = None
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig)
    pressure: PressureConfig = Field(default_factory=PressureConfig)
    capacity_file: Path | None = Field(default=None, description="legacy: a JSON capacity file instead of a source")
    capacity_file_valid_for_seconds: float = seconds(30.0, "validity of a file sample", le=86_400)
    cpu_overcommit: float = cpu_overcommit_ratio(
        1.0,
        "RES-4: CPU reservations may reach the CPU capacity times this ratio (e.g. 4.0: a 2-CPU node "
        "admits 8 CPUs of requests; each Environment keeps its own CPU limit). Memory and disk are never "
        "overcommitted. docs/resources.md",
    )
    runtime: SandboxdRuntimeConfig = SandboxdRuntimeConfig()
    idle_check_interval_seconds: float = seconds(
        5.0,
        "the longest an Environment's idle and runtime checks wait without a wake-up; they are woken "
        "by its runtime-control events, its Relay streams, its transitions and its own deadlines (CTL-2, CTL-4)",
        le=60,
    )
    degradation_journal: Path | None = Field(
        default=None,
        description="SQLite file holding results the Coordinator could not store (JRN-1..8, docs/outages.md); "
        "unset: such results wait in memory only",
    )
    metrics_interval_seconds: float = seconds(
        15.0, "MET-1: how often running Environments' CPU and memory are sampled", le=3600
    )
    metrics_listen: str = Field(
        default="",
        pattern=METRICS_LISTEN_PATTERN,
        description="host:port serving Prometheus /metrics (MET-4); empty: not served",
    )
    logging: LoggingConfig = LoggingConfig()

    @model_validator(mode="after")
    def _one_capacity_source(self) -> NodeConfig:
        # RES-1: a resource source or a legacy capacity file, never both.
        if self.resource_source is not None and self.capacity_file is not None:
            raise ValueError("resource_source and capacity_file are mutually exclusive; configure one")
        return self

    @property
    def effective_resource_source(self) -> AutoResourceSource | SandboxdResourceSource | None:
        """The configured source; the default is ``auto`` when neither a source nor a file is set."""
        if self.resource_source is None and self.capacity_file is None:
            return AutoResourceSource()
        return self.resource_source
