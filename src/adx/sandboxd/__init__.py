"""sandboxd: the node-local sandbox daemon (process sandboxes, persistent registry, restart recovery).

Public surface: the configuration model, the typed async client and its wire models, and ``run`` (the
daemon entry used by ``adx sandboxd``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adx.sandboxd._client import SandboxdClient, ref_of
    from adx.sandboxd._config import CapacityConfig, DefaultsConfig, SandboxdConfig
    from adx.sandboxd._control_client import AdmissionResult, RuntimeControlEvent, RuntimeControlSubscription
    from adx.sandboxd._daemon import run
    from adx.sandboxd._errors import PermissionDeniedError
    from adx.sandboxd._logs import LogLine, LogsRequest, LogsResponse
    from adx.sandboxd._models import (
        CheckpointInfo,
        CreateRequest,
        CreateResponse,
        DeleteResponse,
        ExecdOptions,
        ExitStatus,
        Health,
        ProbeOptions,
        ReclaimRequest,
        ReclaimResponse,
        ResourceInfo,
        Resources,
        ResourcesSpec,
        RestoreRequest,
        RuntimeObservation,
        SandboxInfo,
        SandboxRef,
        SetNetworkRequest,
        Stats,
        WaitResponse,
    )
    from adx.sandboxd._states import State

__all__ = [
    "AdmissionResult",
    "CapacityConfig",
    "CheckpointInfo",
    "CreateRequest",
    "CreateResponse",
    "DefaultsConfig",
    "DeleteResponse",
    "ExecdOptions",
    "ExitStatus",
    "Health",
    "LogLine",
    "LogsRequest",
    "LogsResponse",
    "PermissionDeniedError",
    "ProbeOptions",
    "ReclaimRequest",
    "ReclaimResponse",
    "ResourceInfo",
    "Resources",
    "ResourcesSpec",
    "RestoreRequest",
    "RuntimeControlEvent",
    "RuntimeControlSubscription",
    "RuntimeObservation",
    "SandboxInfo",
    "SandboxRef",
    "SandboxdClient",
    "SandboxdConfig",
    "SetNetworkRequest",
    "State",
    "Stats",
    "WaitResponse",
    "ref_of",
    "run",
]

# Public names resolve lazily (PEP 562): the spawner and supervisors import only the few native modules
# they need and start fast, instead of pulling in the whole configuration registry.
_WHERE = {
    "SandboxdClient": "_client",
    "ref_of": "_client",
    "AdmissionResult": "_control_client",
    "RuntimeControlEvent": "_control_client",
    "RuntimeControlSubscription": "_control_client",
    "CapacityConfig": "_config",
    "DefaultsConfig": "_config",
    "SandboxdConfig": "_config",
    "PermissionDeniedError": "_errors",
    "State": "_states",
    "LogLine": "_logs",
    "LogsRequest": "_logs",
    "LogsResponse": "_logs",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(name)
    # adx.config registers SandboxdConfig from this package: load it first so the import cycle resolves.
    import adx.config  # noqa: F401

    if name == "run":
        from adx.sandboxd._daemon import run

        return run

    module = importlib.import_module(f"adx.sandboxd.{_WHERE.get(name, '_models')}")
    return getattr(module, name)
