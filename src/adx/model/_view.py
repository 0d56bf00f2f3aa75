"""An Environment as its tenant sees it over HTTP: what the API answers and what the SDK parses (one model)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from adx.model._lifecycle import Lifecycle
from adx.model._records import CheckpointRef, EnvironmentRecord
from adx.model._resources import Resources
from adx.model._states import EnvironmentState
from adx.model._volumes import VolumeMount

__all__ = ["EnvironmentList", "EnvironmentView"]


class _View(BaseModel):
    # Unknown keys are ignored, not refused: an SDK keeps reading the answers of a newer server.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class EnvironmentView(_View):
    """An Environment as a tenant sees it. Internal fields (tenant, revision, generation) and ``env`` values
    (they may hold secrets) are not echoed back."""

    id: str
    state: EnvironmentState
    node: str | None = None
    execution_id: str | None = None
    created_at: float = Field(description="Unix time, seconds")
    updated_at: float = Field(description="Unix time, seconds")
    image: str
    resources: Resources
    entrypoint: list[str] | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    lifecycle: Lifecycle
    volumes: list[VolumeMount] = Field(default_factory=list, description="the tenant's volumes it mounts")
    restart_attempts: int = 0
    restart_pending: bool = False
    checkpoint: CheckpointRef | None = None
    expires_at: float | None = Field(default=None, description="the lifetime deadline (Unix time), if any")
    ownership_lost: bool = Field(default=False, description="paused, and its node is gone (resumes elsewhere)")
    recovery_pending: bool = Field(
        default=False,
        description="a recovery from a lost node is under way: a paused state meanwhile is not dormancy, and the "
        "recovery goes on by itself until the Environment runs on another node",
    )
    last_error: str | None = None
    publication_pending: bool = Field(
        default=False,
        description="the Coordinator is away and this is the owning node's view: a result it finished (pause, "
        "resume, idle delete, exit, restart) is not yet stored by the cluster (ENV-6, docs/outages.md)",
    )

    @classmethod
    def of(cls, record: EnvironmentRecord, *, publication_pending: bool = False) -> EnvironmentView:
        return cls(
            publication_pending=publication_pending,
            id=record.id,
            state=record.state,
            node=record.node,
            execution_id=record.execution_id,
            created_at=record.created_at,
            updated_at=record.updated_at,
            image=record.spec.image,
            resources=record.spec.resources,
            entrypoint=record.spec.entrypoint,
            metadata=record.spec.metadata,
            lifecycle=record.spec.lifecycle,
            volumes=record.spec.volumes,
            restart_attempts=record.restart_attempts,
            restart_pending=record.restart_pending,
            checkpoint=record.checkpoint,
            expires_at=record.expires_at,
            ownership_lost=record.ownership_lost,
            recovery_pending=record.recovery_pending,
            last_error=record.last_error,
        )

    def wire(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


class EnvironmentList(_View):
    environments: list[EnvironmentView]
