"""The public REST API server (``adx api``): Environments lifecycle over the Coordinator, OpenAPI documented.

Only the configuration model is imported eagerly: ``adx.config`` imports it, and loading FastAPI and gRPC
into every component that reads configuration would be waste.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adx.api._config import ApiConfig

if TYPE_CHECKING:
    from adx.api._app import Plane, create_app
    from adx.api._coordinator import CoordinatorClient, Route
    from adx.api._server import serve

__all__ = ["ApiConfig", "CoordinatorClient", "Plane", "Route", "create_app", "serve"]

_LAZY = {
    "Plane": "adx.api._app",
    "create_app": "adx.api._app",
    "CoordinatorClient": "adx.api._coordinator",
    "Route": "adx.api._coordinator",
    "serve": "adx.api._server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'adx.api' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
