"""Configuration of ``adx coordinator``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from adx.config._base import LoggingConfig, StrictModel
from adx.config._fields import NAME_PATTERN, seconds


class CoordinatorConfig(StrictModel):
    name: str = Field(default="main", pattern=NAME_PATTERN, description="certificate name")
    listen: str = Field(default="127.0.0.1:7401", description="host:port of the gRPC service")
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        pattern=r"^((redis|rediss|unix)://.*|redis\+sentinel://([^@/]*@)?[^/,@]+:\d+(,[^/,@]+:\d+)*/[^/]+(/\d+)?)$",
        description="redis://, rediss://, unix:// or redis+sentinel://[[user]:password@]host:port[,host:port...]"
        "/service_name[/db] (follows the Sentinel-promoted primary; docs/high-availability.md)",
    )
    certs_dir: Path = Field(default=Path(".adx/certs"), description="holds ca.pem and coordinator-<name>.pem/.key")
    session_ttl_seconds: float = seconds(15.0, "a node whose heartbeat is older than this loses its session", le=3600)
    redis_timeout_seconds: float = seconds(5.0, "bound of each Redis command", le=60)
    node_rpc_timeout_seconds: float = seconds(10.0, "bound of each call to a node (admit, pause, delete, ...)", le=600)
    scan_interval_seconds: float = seconds(1.0, "CRD-3: retention expiry, lifetime deadlines, stalled resumes", le=3600)
    resume_retry_seconds: float = seconds(
        30.0, "CRD-5: when every node refused a resume, ask again after this", le=3600
    )
    leader_lease_seconds: float = seconds(
        5.0,
        "HA: TTL of the leader lease in Redis; renewed every third of it. A standby takes over at most "
        "this long after the active replica froze, sooner after it died (docs/high-availability.md)",
        le=60,
        ge=0.5,
    )
    redis_wait_replicas: int = Field(
        default=0,
        ge=0,
        le=16,
        description="acknowledge a write only once this many Redis replicas have it (WAIT); 0: the primary's "
        "acknowledgement suffices (asynchronous replication: a Sentinel failover may lose the last writes)",
    )
    redis_wait_timeout_seconds: float = seconds(
        1.0, "how long a write waits for redis_wait_replicas; then it is uncertain", le=60
    )
    logging: LoggingConfig = LoggingConfig()
