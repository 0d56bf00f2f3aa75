"""Configuration of ``adx coordinator``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from adx.config._base import LoggingConfig, StrictModel


class CoordinatorConfig(StrictModel):
    name: str = Field(default="main", pattern=r"^[a-z0-9][a-z0-9.-]{0,62}$", description="certificate name")
    listen: str = Field(default="127.0.0.1:7401", description="host:port of the gRPC service")
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        pattern=r"^((redis|rediss|unix)://.*|redis\+sentinel://([^@/]*@)?[^/,@]+:\d+(,[^/,@]+:\d+)*/[^/]+(/\d+)?)$",
        description="redis://, rediss://, unix:// or redis+sentinel://[[user]:password@]host:port[,host:port...]"
        "/service_name[/db] (follows the Sentinel-promoted primary; docs/high-availability.md)",
    )
    certs_dir: Path = Field(default=Path(".adx/certs"), description="holds ca.pem and coordinator-<name>.pem/.key")
    session_ttl_seconds: float = Field(
        default=15.0, gt=0, le=3600, description="a node whose heartbeat is older than this loses its session"
    )
    redis_timeout_seconds: float = Field(default=5.0, gt=0, le=60, description="bound of each Redis command")
    node_rpc_timeout_seconds: float = Field(
        default=10.0, gt=0, le=600, description="bound of each call to a node (admit, pause, delete, ...)"
    )
    scan_interval_seconds: float = Field(
        default=1.0, gt=0, le=3600, description="CRD-3: retention expiry, lifetime deadlines, stalled resumes"
    )
    resume_retry_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="CRD-5: when every node refused a resume, ask again after this"
    )
    leader_lease_seconds: float = Field(
        default=5.0,
        ge=0.5,
        le=60,
        description="HA: TTL of the leader lease in Redis; renewed every third of it. A standby takes over at most "
        "this long after the active replica froze, sooner after it died (docs/high-availability.md)",
    )
    redis_wait_replicas: int = Field(
        default=0,
        ge=0,
        le=16,
        description="acknowledge a write only once this many Redis replicas have it (WAIT); 0: the primary's "
        "acknowledgement suffices (asynchronous replication: a Sentinel failover may lose the last writes)",
    )
    redis_wait_timeout_seconds: float = Field(
        default=1.0, gt=0, le=60, description="how long a write waits for redis_wait_replicas; then it is uncertain"
    )
    logging: LoggingConfig = LoggingConfig()
