"""Typed wire and storage models of sandboxd (shared by the daemon and its client).

The API is JSON over HTTP/1.1 on a private Unix socket: ``POST /v1/<Call>`` with the request model as the
body; errors are ``{"error": {"code", "message", "details"}}`` with the ``adx.errors`` family's code.

Split by idea: ``_sandbox_models`` (a sandbox, its record and options), ``_call_models`` (the per-sandbox
calls), ``_checkpoint_models`` (checkpoints, restores, layers), ``_health_models`` (Stats, Resource, Health)
and ``_observation_models`` (runtime control). This module gathers them: import from here.
"""

from __future__ import annotations

from adx.sandboxd._call_models import (
    CreateRequest,
    CreateResponse,
    DeleteResponse,
    ListResponse,
    OutputResponse,
    ReclaimRequest,
    ReclaimResponse,
    SandboxInfo,
    SetNetworkRequest,
    WaitRequest,
    WaitResponse,
)
from adx.sandboxd._checkpoint_models import (
    CheckpointInfo,
    CheckpointRef,
    CheckpointRequest,
    CommitLayerRequest,
    CommitLayerResponse,
    ListCheckpointsRequest,
    ListCheckpointsResponse,
    RestoreRequest,
    StoredCheckpoint,
)
from adx.sandboxd._health_models import (
    CgroupsInfo,
    DeviceInfo,
    Health,
    ResourceInfo,
    Stats,
    WarmPoolInfo,
)
from adx.sandboxd._observation_models import (
    ActivityObservation,
    CheckpointRequestObservation,
    ProbeObservation,
    RuntimeObservation,
)
from adx.sandboxd._sandbox_models import (
    LOG_GROUP_PATTERN,
    SANDBOX_ID_RE,
    TOKEN_PATTERN,
    CallerToken,
    ExecdOptions,
    ExitStatus,
    LogGroup,
    NativeIdentity,
    ProbeOptions,
    Resources,
    ResourcesSpec,
    SandboxRecord,
    SandboxRef,
    VolumeBinds,
    WireModel,
)

__all__ = [
    "LOG_GROUP_PATTERN",
    "SANDBOX_ID_RE",
    "TOKEN_PATTERN",
    "ActivityObservation",
    "CallerToken",
    "CgroupsInfo",
    "CheckpointInfo",
    "CheckpointRef",
    "CheckpointRequest",
    "CheckpointRequestObservation",
    "CommitLayerRequest",
    "CommitLayerResponse",
    "CreateRequest",
    "CreateResponse",
    "DeleteResponse",
    "DeviceInfo",
    "ExecdOptions",
    "ExitStatus",
    "Health",
    "ListCheckpointsRequest",
    "ListCheckpointsResponse",
    "ListResponse",
    "LogGroup",
    "NativeIdentity",
    "OutputResponse",
    "ProbeObservation",
    "ProbeOptions",
    "ReclaimRequest",
    "ReclaimResponse",
    "ResourceInfo",
    "Resources",
    "ResourcesSpec",
    "RestoreRequest",
    "RuntimeObservation",
    "SandboxInfo",
    "SandboxRecord",
    "SandboxRef",
    "SetNetworkRequest",
    "Stats",
    "StoredCheckpoint",
    "VolumeBinds",
    "WaitRequest",
    "WaitResponse",
    "WarmPoolInfo",
    "WireModel",
]
