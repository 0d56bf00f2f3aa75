"""The HTTP application assembled from its parts (the /v1 lifecycle routes, the agent runs, the Ingress's data
plane, the E2B layer), and running it under uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from adx._certs import Identity, component_paths
from adx._grpc_tls import channel_credentials
from adx._node_client import NodeClients
from adx._wsproxy import MAX_MESSAGE_BYTES as WS_MAX_MESSAGE_BYTES
from adx.api._admin_routes import router as admin_router
from adx.api._agent_routes import close_agent_store
from adx.api._agent_routes import router as agent_router
from adx.api._logs_routes import logs_router
from adx.api._openapi_links import add_links
from adx.api._routes import router
from adx.api._token_routes import token_router
from adx.api._ui import ui_router
from adx.api._volume_routes import volume_router
from adx.e2b import install as install_e2b
from adx.errors import UnavailableError
from adx.gateway import (
    BODY_MODELS,
    ApiConfig,
    CoordinatorClient,
    OpenApiObject,
    Plane,
    TenantAuth,
    install_error_handlers,
)
from adx.gateway._config import split_host_port
from adx.ingress import Ingress
from adx.ingress import router as ingress_router

log = logging.getLogger("adx.api")


async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _openapi(app: FastAPI) -> OpenApiObject:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, model in BODY_MODELS.items():
        body = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        for nested, definition in body.pop("$defs", {}).items():
            components.setdefault(nested, definition)
        components[name] = body
    add_links(schema)
    app.openapi_schema = schema
    return schema


def create_app(config: ApiConfig, *, api: bool = True, ingress: bool | None = None) -> FastAPI:
    """The HTTP application. ``api``: the lifecycle routes; ``ingress``: the data-plane routes (default: config)."""
    with_ingress = config.ingress if ingress is None else ingress

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        coordinator = CoordinatorClient.from_config(config)
        node_credentials = channel_credentials(component_paths(config.certs_dir, Identity("api", config.name)))
        p = Plane(
            config,
            coordinator,
            TenantAuth(coordinator, config.auth_cache_seconds),
            NodeClients(node_credentials, rpc_timeout=config.coordinator_timeout_seconds),
        )
        if with_ingress:
            data_plane = Ingress.from_config(config, coordinator)
            data_plane.start_following()
            p.routes = data_plane
            app.state.ingress = data_plane
        app.state.plane = p
        try:
            yield
        finally:
            await p.close()
            await close_agent_store(app)

    app = FastAPI(
        title="ADX API",
        version="1",
        description="Environments (sandboxes with lifecycle policies) and their data plane.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_api_route("/healthz", healthz, methods=["GET"], include_in_schema=False)
    if api:
        app.include_router(router)
        app.include_router(logs_router)
        app.include_router(agent_router)
        app.include_router(admin_router)
        app.include_router(token_router)
        app.include_router(volume_router)
        app.include_router(ui_router)  # the web dashboard at /ui (docs/dashboard.md)
    if with_ingress:
        app.include_router(ingress_router)
    if config.e2b:
        install_e2b(app, control_plane=api, data_plane=with_ingress)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


class _Server(uvicorn.Server):
    """uvicorn's server, logging the bound address (``listen`` may ask for port 0) once it accepts."""

    component = "api"

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            bound = [s.getsockname() for srv in self.servers for s in (srv.sockets or ())]
            host, port = (bound[0][0], bound[0][1]) if bound else (self.config.host, self.config.port)
            log.info(f"{self.component} serving", extra={"url": f"http://{host}:{port}"})


async def serve(config: ApiConfig, *, api: bool = True, ingress: bool | None = None, component: str = "api") -> None:
    # Fail at once with the file's name if our certificate is missing (instead of on the first request).
    component_paths(config.certs_dir, Identity("api", config.name)).read()
    host, port = split_host_port(config.listen)
    app = create_app(config, api=api, ingress=ingress)
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="on",
            log_config=None,  # our own structured logging (adx.logs) stays in charge
            access_log=False,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=30,
            # WebSocket through port routing (adx._wsproxy): wsproto, with the proxy's message limit.
            ws="wsproto",
            ws_max_size=WS_MAX_MESSAGE_BYTES,
        )
    )
    server.component = component
    await server.serve()
    if not server.started:
        raise UnavailableError(f"{component}: could not start on {config.listen} (see the log above)")
