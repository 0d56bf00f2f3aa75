"""Configuration of ``adx agent worker`` (component ``agent-worker``)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from adx.config._base import LoggingConfig, StrictModel
from adx.config._fields import seconds

__all__ = ["AgentEnvironmentsConfig", "AgentMaintenanceConfig", "AgentWorkerConfig", "FairnessConfig"]

# A dotted module path, optionally ``:attribute`` naming one adx.agents.App in it.
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?$")

#: A tenant ID (and a fairness policy's name).
_TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


def _check_tenant_ids(tenants: Iterable[str]) -> None:
    for tenant in tenants:
        if not re.match(_TENANT_PATTERN, tenant):
            raise ValueError(f"{tenant!r} is not a tenant ID")


def _postgres_url(value: str) -> str:
    if not value.startswith(("postgresql://", "postgres://")):
        raise ValueError("must be a postgresql:// URL")
    return value


#: The database both agent components (worker, maintenance) take.
PostgresUrl = Annotated[
    str, AfterValidator(_postgres_url), Field(description="PostgreSQL URL (postgresql://user@host:port/db)")
]


class FairnessConfig(StrictModel):
    """AGT-12: one worker ticks several tenants by a replica-global smooth weighted round robin."""

    policy: str = Field(pattern=_TENANT_PATTERN, description="name of the persisted policy")
    weights: dict[str, int] = Field(description="tenant -> weight (1-1000000); persisted at the first start")
    tenant_database_urls: dict[str, str] = Field(
        default_factory=dict,
        description="tenant -> PostgreSQL URL with that tenant's own credentials (default: database_url)",
    )

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[str, int]) -> dict[str, int]:
        if not 1 <= len(value) <= 128:
            raise ValueError("needs 1 to 128 tenants")
        _check_tenant_ids(value)
        for tenant, weight in value.items():
            if not 1 <= weight <= 1_000_000:
                raise ValueError(f"weight of {tenant!r} must be between 1 and 1000000")
        return value


class AgentEnvironmentsConfig(StrictModel):
    """The ADX API that nodes create Environments through (``ctx.environment``): its URL and a tenant API key."""

    api_url: str = Field(description="URL of the ADX API server (http:// or https://)")
    api_key: SecretStr = Field(
        description="the tenant API key Environments are created with (`adx tenant create`); prefer the override"
        " ADX_AGENT_WORKER__ENVIRONMENTS__API_KEY to writing it in the file"
    )
    timeout_seconds: float = seconds(30.0, "per API call", le=3600)
    ready_timeout_seconds: float = seconds(
        120.0, "how long a create or a resume may take before the node fails", le=3600
    )

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


class AgentWorkerConfig(StrictModel):
    database_url: PostgresUrl
    tenant_id: str = Field(
        default="default",
        pattern=_TENANT_PATTERN,
        description="the tenant whose runs this worker executes (unless fairness names several)",
    )
    registrations: str = Field(
        description="import path of the application module: one defining adx.agents.App graphs (MODULE or"
        " MODULE:APP), or register_graphs(executables) and optionally register_schemas(schemas),"
        " evidence_provider() and readiness(store); the current directory is importable"
    )
    slots: int = Field(default=4, ge=1, le=1024, description="runs this worker executes at the same time")
    tick_deadline_seconds: float = seconds(
        300.0, "longest one scheduler tick (claim and drive) may take before it is abandoned"
    )
    drain_seconds: float = seconds(30.0, "on stop, how long in-flight runs may take to reach a checkpoint")
    idle_poll_seconds: float = seconds(
        0.5, "how long an idle worker waits before it looks for work again (a notification wakes it sooner)"
    )
    lease_seconds: float = seconds(
        30.0,
        "how long a claimed run stays owned without a renewal (renewed every third of it); a run"
        " whose worker stopped renewing is claimable after it. A worker whose process died is detected sooner,"
        " see liveness_grace_seconds",
    )
    liveness_grace_seconds: float = seconds(
        1.0,
        "a dead worker's runs are claimable this long after its last heartbeat, once its database"
        " session is gone (0 turns this off: only lease expiry then; needed behind transaction-pooling proxies)",
        le=3600,
        ge=0,
    )
    node_timeout_seconds: float = seconds(
        120.0, "longest one graph node may run; a slower one counts as a failed attempt"
    )
    max_node_attempts: int = Field(default=5, ge=1, description="failed attempts of one node before its run fails")
    max_nodes_per_claim: int = Field(
        default=64,
        ge=1,
        description="nodes one claim runs before the worker releases the run (other runs get their turn)",
    )
    pool_max_size: int | None = Field(
        default=None, ge=1, le=1000, description="PostgreSQL connections of this worker; unset: slots + 2"
    )
    migrate: bool = Field(default=True, description="apply missing migrations at start (advisory-locked)")
    health_host: str = Field(default="127.0.0.1", description="address of the health endpoint")
    health_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve GET /healthz (JSON health, 503 when not ready); off if unset"
    )
    fairness: FairnessConfig | None = Field(
        default=None, description="tick these tenants fairly (AGT-12) instead of tenant_id alone"
    )
    environments: AgentEnvironmentsConfig | None = Field(
        default=None, description="the ADX API for ctx.environment(...); without it a node asking for one fails"
    )
    logging: LoggingConfig = LoggingConfig()

    @model_validator(mode="after")
    def _one_tenant_per_api_key(self) -> AgentWorkerConfig:
        # One API key is one ADX tenant: a fair worker's tenants would all create Environments as that tenant.
        if self.environments is not None and self.fairness is not None:
            raise ValueError("environments cannot be combined with fairness yet (one API key serves one tenant)")
        return self

    @field_validator("registrations")
    @classmethod
    def _module_path(cls, value: str) -> str:
        if not _MODULE.match(value):
            raise ValueError("must be a dotted Python module path (optionally MODULE:APP)")
        return value


class AgentMaintenanceConfig(StrictModel):
    """Configuration of ``adx agent maintenance`` (component ``agent-maintenance``)."""

    database_url: PostgresUrl
    tenants: list[str] = Field(description="1-128 distinct tenant IDs this maintenance process serves")
    interval_seconds: float = Field(default=0.25, gt=0, le=3600)
    error_interval_seconds: float = seconds(1.0, "pause after a tick with item errors", le=3600)
    tick_limit_seconds: float = Field(default=30.0, gt=0, le=3600)
    drain_seconds: float = Field(default=10.0, gt=0, le=3600)
    page_size: int = Field(default=100, ge=1, le=10_000)
    logging: LoggingConfig = LoggingConfig()

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, value: list[str]) -> list[str]:
        if not 1 <= len(value) <= 128:
            raise ValueError("needs 1 to 128 tenants")
        if len(set(value)) != len(value):
            raise ValueError("must be distinct")
        _check_tenant_ids(value)
        return value
