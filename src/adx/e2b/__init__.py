"""E2B-compatible API: programs written for the ``e2b`` Python SDK run unchanged on ADX (see docs/e2b.md).

The control plane (``/v2/sandboxes``, ``/sandboxes/{id}``, ...) is a router of the API server; the envd data
plane is served on the same base URL for requests that carry ``E2b-Sandbox-Id`` and is translated into execd
calls through the Ingress. The wire formats are described in ``adx/e2b/wire/``.
"""

from __future__ import annotations

from fastapi import FastAPI

from adx.e2b._control import router
from adx.e2b._envd import EnvdDataPlane
from adx.e2b._snapshots import snapshot_router
from adx.e2b._template_catalog import catalog_router
from adx.e2b._templates import template_router
from adx.e2b._volumes import volume_router

__all__ = ["EnvdDataPlane", "install", "router"]


def install(app: FastAPI, *, control_plane: bool, data_plane: bool) -> None:
    """Serve the E2B control plane (with the API's routes) and/or the envd data plane (with the Ingress)."""
    if control_plane:
        app.include_router(catalog_router)  # first: DELETE /templates/tags is no template's DELETE /templates/{id}
        app.include_router(template_router)  # before snapshot_router: DELETE /templates/{id} of a template
        app.include_router(snapshot_router)  # before router: its catch-all answers what is not served
        app.include_router(volume_router)
        app.include_router(router)
    if data_plane:
        app.add_middleware(EnvdDataPlane)
