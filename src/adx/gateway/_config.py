"""Configuration of ``adx api`` (and of ``adx ingress``, which reads the same model)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from adx.config._base import LoggingConfig, StrictModel
from adx.config._fields import NAME_PATTERN, CoordinatorTargets, seconds


def split_host_port(value: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ``[::1]:80`` style IPv6 literals are accepted."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be host:port, got {value!r}")
    return host.strip("[]"), int(port)


class ApiConfig(StrictModel):
    name: str = Field(default="main", pattern=NAME_PATTERN, description="certificate name: presents api:<name>")
    listen: str = Field(default="127.0.0.1:8080", description="host:port of the HTTP server (port 0: any free port)")
    coordinator: CoordinatorTargets = Field(
        default="localhost:7401",
        description="host:port of the Coordinator's gRPC service; with several replicas (HA) a list, or one "
        "string 'a:7401,b:7401': calls go to the active one (docs/high-availability.md)",
    )
    certs_dir: Path = Field(default=Path(".adx/certs"), description="holds ca.pem and api-<name>.pem/.key")
    coordinator_timeout_seconds: float = seconds(10.0, "deadline of a read call", le=600)
    create_timeout_seconds: float = seconds(
        30.0, "deadline of CreateEnvironment (placement and admission on the node)", le=600
    )
    auth_cache_seconds: float = seconds(30.0, "how long a key->tenant answer is reused", le=3600, ge=0)
    route_cache_seconds: float = seconds(2.0, "how long an Ingress route is reused", le=300, ge=0)
    ingress: bool = Field(default=True, description="serve the data-plane (Ingress) routes on the same port")
    e2b: bool = Field(
        default=True, description="serve the E2B-compatible API (control plane and envd data plane, docs/e2b.md)"
    )
    e2b_domain: str = Field(
        default="",
        pattern=r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*(:[0-9]{1,5})?)?$",
        description="E2B: the domain of sandbox host names (get_host: PORT-ID.<proof>.DOMAIN); empty: localhost "
        "with the API's port (docs/e2b.md)",
    )
    e2b_capacity_wait_seconds: float = seconds(
        30.0,
        "E2B: how long a create that no node has room for waits for capacity before its 503 (the E2B SDK does not "
        "retry a 503; its requests time out after 60 s)",
        le=600,
        ge=0,
    )
    start_wait_seconds: float = seconds(
        30.0, "Ingress: how long a request waits for a pending/starting Environment", le=600, ge=0
    )
    wake_timeout_seconds: float = seconds(
        60.0, "how long a request to a paused Environment waits for its resume", le=3600
    )
    relay_connect_timeout_seconds: float = seconds(5.0, "how long connecting to a node's Relay may take", le=120)
    relay_timeout_seconds: float = seconds(300.0, "Ingress: idle read/write timeout towards the Relay", le=86_400)
    max_body_bytes: int = Field(default=1 << 20, gt=0, le=1 << 30, description="largest JSON request body")
    agent_database_url: str | None = Field(
        default=None,
        pattern=r"^postgres(ql)?://",
        description="the durable agent runs' PostgreSQL (/v1/agent-runs; docs/agents.md); unset: the "
        "ADX_AGENT_DATABASE_URL variable, else those routes answer 503",
    )
    images_dir: Path | None = Field(
        default=None,
        description="the nodes' image store (sandboxd's images_dir, shared): creates naming an image it lacks get "
        "422 (field image / templateID) at once; unset: the node pulls the image from a node that has it, or fails "
        "the start naming it",
    )
    volumes_dir: Path | None = Field(
        default=None,
        description="the volume root (docs/volumes.md): the nodes' runtime.volumes_dir, on shared storage for more "
        "than one node; unset: volume routes answer 503 and creates that mount volumes are refused",
    )
    image_build_socket: Path | None = Field(
        default=None,
        description="a node's sandboxd API socket that runs E2B template builds (POST /v3/templates; its images_dir "
        "must be images_dir); unset: template builds answer 501",
    )
    logging: LoggingConfig = LoggingConfig()

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        split_host_port(value)
        return value

    @field_validator("coordinator")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        for item in value.split(","):
            split_host_port(item.strip())
        return value
