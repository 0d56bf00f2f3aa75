"""Runtime control: what execd last reported for a sandbox, as the subscription carries it (camelCase on the
wire; unknown keys are ignored so execd can add some).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = [
    "ActivityObservation",
    "CheckpointRequestObservation",
    "ProbeObservation",
    "RuntimeObservation",
]


class _Observation(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra="ignore")


class ActivityObservation(_Observation):
    version: int
    active: int
    background_running: int
    admission_open: bool


class ProbeObservation(_Observation):
    ok: bool
    consecutive_failures: int
    reason: str | None = None


class CheckpointRequestObservation(_Observation):
    operation_id: str
    reason: str | None = None
    requested_at: float = 0.0


class RuntimeObservation(_Observation):
    """What execd last reported for one sandbox (CTL-1); absent = no live execd connection (CTL-3)."""

    ready: bool
    probe: ProbeObservation | None = None
    activity: ActivityObservation
    checkpoint_requests: list[CheckpointRequestObservation] = Field(default_factory=list)
    workload_exit_code: int | None = None
    #: Why sandboxd refused this sandbox's execd (CTL-8: another protocol version); None when it is served.
    refused: str | None = None
