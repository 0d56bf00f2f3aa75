"""Checkpoints and layers on the wire: Checkpoint, ListCheckpoints, DeleteCheckpoint, Restore and CommitLayer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from adx.model import NetworkPolicy
from adx.sandboxd._sandbox_models import (
    CallerToken,
    ExecdOptions,
    LogGroup,
    ResourcesSpec,
    SandboxRef,
    VolumeBinds,
    WireModel,
)

__all__ = [
    "CheckpointInfo",
    "CheckpointRef",
    "CheckpointRequest",
    "CommitLayerRequest",
    "CommitLayerResponse",
    "ListCheckpointsRequest",
    "ListCheckpointsResponse",
    "RestoreRequest",
    "StoredCheckpoint",
]


class CommitLayerRequest(WireModel):
    """Turn an ended sandbox's writable (upper) layer into store layer ``digest`` (an image build step)."""

    ref: SandboxRef
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    parent: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    step: str = Field(max_length=1 << 16, description="the step text the digest covers")


class CommitLayerResponse(WireModel):
    digest: str
    size_bytes: int


class CheckpointRequest(WireModel):
    ref: SandboxRef
    kind: Literal["filesystem"] = "filesystem"
    storage: str = Field(default="local", description="name of a configured artifact root")
    leave_running: bool = Field(default=True, description="thaw after capture (else stop the workload)")


class CheckpointInfo(WireModel):
    checkpoint_id: str
    kind: Literal["filesystem"]
    location: str
    digest: str = Field(description="sha256 of manifest.json; Restore requires it")
    layer_sha256: str
    size_bytes: int
    created_at: float
    source_sandbox_id: str


class CheckpointRef(WireModel):
    location: str
    digest: str = Field(description="the checkpoint's digest: only an artifact you can name exactly is deleted")


class ListCheckpointsRequest(WireModel):
    storage: str = Field(default="local", description="name of a configured artifact root")


class StoredCheckpoint(WireModel):
    checkpoint_id: str
    location: str
    digest: str = Field(description="sha256 of manifest.json")
    size_bytes: int
    created_at: float
    source_sandbox_id: str


class ListCheckpointsResponse(WireModel):
    storage: str
    checkpoints: list[StoredCheckpoint] = Field(description="whole artifacts this daemon captured there")


class RestoreRequest(WireModel):
    request_id: str = Field(min_length=1, max_length=200)
    location: str
    digest: str
    sandbox_id: str | None = None
    generation: int = Field(default=1, ge=1)
    token: CallerToken = None
    argv: list[str] | None = None
    init_argv: list[str] | None = None
    execd: ExecdOptions | None = Field(default=None, description="default: the checkpointed sandbox's")
    env: dict[str, str] | None = None
    resources: ResourcesSpec | None = None
    metadata: dict[str, str] | None = None
    ttl_seconds: float | None = Field(default=None, gt=0)
    network_policy: NetworkPolicy | None = Field(
        default=None, description="default: the checkpointed sandbox's network and policy"
    )
    log_group: LogGroup = Field(default=None, description="as CreateRequest.log_group (not taken from the checkpoint)")
    volumes: VolumeBinds = Field(default_factory=dict, description="as CreateRequest.volumes (not checkpointed)")
