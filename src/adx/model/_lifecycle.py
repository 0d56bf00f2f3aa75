"""Lifecycle policy of an Environment (ENV-1..3, RST-2, RST-6): idle action, pause options, restarts."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, Strict, model_serializer, model_validator

from adx._backoff import capped_exponential
from adx.model._base import INTEGRAL, ApiModel, WholeNumber

DEFAULT_RETENTION_TTL_SECONDS = 90_000
DEFAULT_PAUSE_TIMEOUT_SECONDS = 300
PAUSE_PUBLICATION_MARGIN_SECONDS = 30.0


class IdleAction(StrEnum):
    DELETE = "delete"
    PAUSE = "pause"


class CheckpointStorage(StrEnum):
    CONFIGURED = "configured"  # the node's configured default
    LOCAL = "local"  # the node's own disk
    SHARED = "shared"  # the cluster's shared storage (needed to resume on another node)


class RetentionPolicy(ApiModel):
    """ENV-3: ``{"kind": "ttl", "ttlSeconds": 90000}`` (default) or ``{"kind": "forever"}``.

    A TTL counts from the checkpoint's publication; ``forever`` lives until explicit delete or replacement.
    """

    # The schema says what _ttl_matches_kind enforces: with kind 'forever', ttlSeconds is absent or null.
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra={
            "if": {"properties": {"kind": {"const": "forever"}}, "required": ["kind"]},
            "then": {"properties": {"ttlSeconds": {"type": "null"}}},
        }
    )

    kind: Literal["ttl", "forever"] = "ttl"
    ttl_seconds: Annotated[int, Strict(), Field(gt=0, le=10 * 365 * 86_400), INTEGRAL] | None = None

    @model_validator(mode="after")
    def _ttl_matches_kind(self) -> RetentionPolicy:
        if self.kind == "ttl" and self.ttl_seconds is None:
            object.__setattr__(self, "ttl_seconds", DEFAULT_RETENTION_TTL_SECONDS)
        if self.kind == "forever" and self.ttl_seconds is not None:
            raise ValueError("ttlSeconds is only allowed with kind 'ttl'")
        return self

    @model_serializer(mode="wrap")
    def _omit_ttl_for_forever(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        if self.kind == "forever":
            data.pop("ttlSeconds", None)
            data.pop("ttl_seconds", None)
        return data


class Retention:
    """Constructors for a checkpoint's retention: ``Retention.ttl(3600)`` or ``Retention.forever()``."""

    @staticmethod
    def ttl(seconds: int = DEFAULT_RETENTION_TTL_SECONDS) -> RetentionPolicy:
        return RetentionPolicy(kind="ttl", ttl_seconds=seconds)

    @staticmethod
    def forever() -> RetentionPolicy:
        return RetentionPolicy(kind="forever")


class PauseOptions(ApiModel):
    """ENV-3. ``timeout_seconds`` bounds only the backend capture call; TTL counts from publication."""

    retention: RetentionPolicy = Field(default_factory=RetentionPolicy)
    timeout_seconds: WholeNumber = Field(default=DEFAULT_PAUSE_TIMEOUT_SECONDS, ge=1, le=3600)
    storage: CheckpointStorage = CheckpointStorage.CONFIGURED

    @property
    def wait_seconds(self) -> float:
        """How long a caller waits for a whole pause: the capture's bound plus time to publish and commit."""
        return float(self.timeout_seconds) + PAUSE_PUBLICATION_MARGIN_SECONDS


class RestartPolicy(ApiModel):
    """RST-2: exponential backoff with a cumulative retry cap. ``maxBackoffSeconds`` caps every delay, the first
    included: with it below ``initialBackoffSeconds`` every restart waits ``maxBackoffSeconds`` (a valid request,
    so that any two values the schema allows are accepted)."""

    max_retries: WholeNumber = Field(default=3, ge=0, le=1000)
    initial_backoff_seconds: float = Field(default=1.0, gt=0, le=3600, allow_inf_nan=False)
    max_backoff_seconds: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False)

    def backoff_seconds(self, attempt: int) -> float:
        """Delay before restart number ``attempt`` (1-based): initial * 2^(attempt-1), capped."""
        if attempt < 1:
            raise ValueError("attempt is 1-based")
        return capped_exponential(self.initial_backoff_seconds, self.max_backoff_seconds, attempt - 1)

    def allows(self, attempts_so_far: int) -> bool:
        return attempts_so_far < self.max_retries


class HealthProbe(ApiModel):
    """CTL-1/RST-6: execd probes the workload (a command that exits 0, or a TCP port that accepts) and pushes
    explicit failures; with ``execdHealthFailureThreshold`` set, that many in a row end the execution."""

    # The schema says what _one_kind enforces: exactly one of command and tcpPort is given (and not null).
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["command"], "properties": {"command": {"type": "string"}, "tcpPort": {"type": "null"}}},
                {"required": ["tcpPort"], "properties": {"tcpPort": {"type": "integer"}, "command": {"type": "null"}}},
            ]
        }
    )

    command: str | None = Field(default=None, min_length=1, max_length=4096)
    tcp_port: Annotated[int, Strict(), Field(ge=1, le=65535), INTEGRAL] | None = None
    interval_seconds: float = Field(default=5.0, gt=0, le=3600, allow_inf_nan=False)
    timeout_seconds: float = Field(default=2.0, gt=0, le=3600, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_kind(self) -> HealthProbe:
        if (self.command is None) == (self.tcp_port is None):
            raise ValueError("give exactly one of command or tcpPort")
        return self


class Lifecycle(ApiModel):
    """ENV-1. ``idle_timeout_seconds = 0`` never reclaims (IDLE-1)."""

    # The schema says what _pause_needs_a_window enforces: idleAction 'pause' needs idleTimeoutSeconds >= 1.
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra={
            "if": {"properties": {"idleAction": {"const": "pause"}}, "required": ["idleAction"]},
            "then": {"properties": {"idleTimeoutSeconds": {"minimum": 1}}, "required": ["idleTimeoutSeconds"]},
        }
    )

    idle_timeout_seconds: WholeNumber = Field(default=0, ge=0, le=30 * 86_400)
    idle_action: IdleAction = IdleAction.DELETE
    pause_options: PauseOptions | None = None
    restart_policy: RestartPolicy | None = None
    # RST-6: omitted means health failures never trigger a restart.
    execd_health_failure_threshold: Annotated[int, Strict(), Field(ge=1, le=1000), INTEGRAL] | None = None
    health_probe: HealthProbe | None = None
    # An absolute lifetime from creation (E2B's ``timeout``); a running Environment can move it later. At
    # the deadline it is deleted or paused (``lifetime_action``). None: no deadline.
    lifetime_seconds: Annotated[int, Strict(), Field(ge=1, le=30 * 86_400), INTEGRAL] | None = None
    lifetime_action: IdleAction = IdleAction.DELETE
    # ENV-4: business traffic to a paused Environment resumes it. False: it stays paused until an explicit
    # resume (EnsureRunning: the E2B ``connect``); its traffic is refused meanwhile (E2B's ``autoResume`` off).
    wake_on_traffic: Annotated[bool, Strict()] = True

    @model_validator(mode="after")
    def _pause_needs_a_window(self) -> Lifecycle:
        # ENV-2 (request half): the node half (checkpoint capability) is checked at placement.
        if self.idle_action is IdleAction.PAUSE and self.idle_timeout_seconds <= 0:
            raise ValueError("idleAction 'pause' requires a positive idleTimeoutSeconds")
        return self

    @property
    def may_pause(self) -> bool:
        """Whether this Environment can ever be paused automatically (ENV-2: needs a checkpoint-capable node)."""
        return self.idle_action is IdleAction.PAUSE or (
            self.lifetime_seconds is not None and self.lifetime_action is IdleAction.PAUSE
        )

    @property
    def effective_pause_options(self) -> PauseOptions:
        return self.pause_options or PauseOptions()
