"""sandboxd: the node-local sandbox daemon (process sandboxes, persistent registry, restart recovery).

Public surface: the configuration model, the typed async client and its wire models, and ``run`` (the
daemon entry used by ``adx sandboxd``).
"""

from __future__ import annotations

# adx.config registers SandboxdConfig from this package: load it first so the import cycle resolves.
import adx.config  # noqa: F401
from adx.sandboxd._client import SandboxdClient, ref_of
from adx.sandboxd._config import CapacityConfig, DefaultsConfig, SandboxdConfig
from adx.sandboxd._errors import PermissionDeniedError
from adx.sandboxd._models import (
    CheckpointInfo,
    CreateRequest,
    CreateResponse,
    DeleteResponse,
    ExitStatus,
    Health,
    ResourceInfo,
    Resources,
    ResourcesSpec,
    RestoreRequest,
    SandboxInfo,
    SandboxRef,
    Stats,
    WaitResponse,
)
from adx.sandboxd._states import State

__all__ = [
    "CapacityConfig",
    "CheckpointInfo",
    "CreateRequest",
    "CreateResponse",
    "DefaultsConfig",
    "DeleteResponse",
    "ExitStatus",
    "Health",
    "PermissionDeniedError",
    "ResourceInfo",
    "Resources",
    "ResourcesSpec",
    "RestoreRequest",
    "SandboxInfo",
    "SandboxRef",
    "SandboxdClient",
    "SandboxdConfig",
    "State",
    "Stats",
    "WaitResponse",
    "ref_of",
    "run",
]


def run(config: SandboxdConfig) -> int:
    from adx.sandboxd._daemon import run as _run

    return _run(config)
