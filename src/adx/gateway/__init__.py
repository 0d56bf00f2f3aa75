"""What every HTTP front door of ADX shares: the API server's configuration, the Coordinator client, tenant
authentication, the request context and the mapping of ADX errors to HTTP answers.

The lifecycle routes (``adx.api``), the data plane (``adx.ingress``) and the E2B layer (``adx.e2b``) are built on
it and assembled into one application by ``adx.api``; this package imports none of them.

Only the configuration model is imported eagerly: the CLI reads it to load configuration files, and loading
FastAPI and gRPC for that would be waste.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adx.gateway._config import ApiConfig

if TYPE_CHECKING:
    from adx.gateway._auth import TenantAuth
    from adx.gateway._context import (
        ERRORS,
        Credentials,
        Plane,
        RouteCache,
        TenantEnv,
        TenantEnvironment,
        environment_id_or_404,
        plane,
        read_body,
        read_json,
        tenant_environment,
    )
    from adx.gateway._coordinator import CoordinatorClient, Route
    from adx.gateway._errors import (
        ErrorBody,
        Unauthenticated,
        error_response,
        install_error_handlers,
        not_found,
        retry_after_seconds,
        status_for,
    )
    from adx.gateway._openapi import BODY_MODELS, OpenApiObject, OpenApiResponses, error_answer, json_body, raw_body
    from adx.gateway._volumes import check_volume_mounts, delete_volume, volume_store
    from adx.gateway._wait import MAX_WAIT_SECONDS, ON_THE_WAY, wait_running, wait_timeout

__all__ = [
    "BODY_MODELS",
    "ERRORS",
    "MAX_WAIT_SECONDS",
    "ON_THE_WAY",
    "ApiConfig",
    "CoordinatorClient",
    "Credentials",
    "ErrorBody",
    "OpenApiObject",
    "OpenApiResponses",
    "Plane",
    "Route",
    "RouteCache",
    "TenantAuth",
    "TenantEnv",
    "TenantEnvironment",
    "Unauthenticated",
    "check_volume_mounts",
    "delete_volume",
    "environment_id_or_404",
    "error_answer",
    "error_response",
    "install_error_handlers",
    "json_body",
    "not_found",
    "plane",
    "raw_body",
    "read_body",
    "read_json",
    "retry_after_seconds",
    "status_for",
    "tenant_environment",
    "volume_store",
    "wait_running",
    "wait_timeout",
]

_LAZY = {
    "TenantAuth": "adx.gateway._auth",
    "BODY_MODELS": "adx.gateway._openapi",
    "OpenApiObject": "adx.gateway._openapi",
    "json_body": "adx.gateway._openapi",
    "raw_body": "adx.gateway._openapi",
    "ERRORS": "adx.gateway._context",
    "Credentials": "adx.gateway._context",
    "Plane": "adx.gateway._context",
    "RouteCache": "adx.gateway._context",
    "environment_id_or_404": "adx.gateway._context",
    "plane": "adx.gateway._context",
    "read_body": "adx.gateway._context",
    "read_json": "adx.gateway._context",
    "TenantEnv": "adx.gateway._context",
    "TenantEnvironment": "adx.gateway._context",
    "tenant_environment": "adx.gateway._context",
    "CoordinatorClient": "adx.gateway._coordinator",
    "Route": "adx.gateway._coordinator",
    "ErrorBody": "adx.gateway._errors",
    "Unauthenticated": "adx.gateway._errors",
    "error_answer": "adx.gateway._openapi",
    "OpenApiResponses": "adx.gateway._openapi",
    "error_response": "adx.gateway._errors",
    "install_error_handlers": "adx.gateway._errors",
    "not_found": "adx.gateway._errors",
    "retry_after_seconds": "adx.gateway._errors",
    "status_for": "adx.gateway._errors",
    "check_volume_mounts": "adx.gateway._volumes",
    "delete_volume": "adx.gateway._volumes",
    "volume_store": "adx.gateway._volumes",
    "MAX_WAIT_SECONDS": "adx.gateway._wait",
    "ON_THE_WAY": "adx.gateway._wait",
    "wait_running": "adx.gateway._wait",
    "wait_timeout": "adx.gateway._wait",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'adx.gateway' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
