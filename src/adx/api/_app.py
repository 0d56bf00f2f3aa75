"""The public REST API (``adx api``): Environments create/get/list/delete, tenant-scoped, OpenAPI at /openapi.json.

Every route authenticates first (``Authorization: Bearer <API key>``), then asks the Coordinator on behalf of
that tenant only; the Coordinator is the single authority, the API server keeps no state beyond short caches.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, FastAPI, Header, Request, Security
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from adx._certs import Identity, component_paths
from adx._grpc_tls import channel_credentials
from adx._node_client import NodeClients, NodeView
from adx.api._agent_routes import close_agent_store
from adx.api._agent_routes import router as agent_router
from adx.api._auth import TenantAuth
from adx.api._config import ApiConfig
from adx.api._coordinator import CoordinatorClient, Route
from adx.api._errors import install_error_handlers, not_found
from adx.api._schemas import EnvironmentList, EnvironmentView, ErrorBody
from adx.errors import (
    ConflictError,
    EnvironmentPausedError,
    InvalidInputError,
    PublicationPendingError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.model import (
    DORMANT_STATES,
    ENVIRONMENT,
    EnvironmentSpec,
    EnvironmentState,
    EnvironmentStats,
    NetworkPolicy,
    check_id,
    parse_wire,
)

log = logging.getLogger("adx.api")

MAX_IDEMPOTENCY_KEY = 255

bearer = HTTPBearer(auto_error=False, description="a tenant API key (`adx tenant create NAME` prints one)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or unknown API key"},
    404: {"model": ErrorBody, "description": "no such Environment for this tenant"},
    422: {"model": ErrorBody, "description": "invalid input; details.field names the camelCase path"},
    503: {"model": ErrorBody, "description": "no capacity (code no_capacity) or the Coordinator is unavailable"},
    504: {"model": ErrorBody, "description": "outcome uncertain: retry with the same Idempotency-Key"},
}


@dataclass
class Plane:
    """What the request handlers share: the Coordinator client and the tenant cache (Ingress adds its own)."""

    config: ApiConfig
    coordinator: CoordinatorClient
    auth: TenantAuth
    extras: dict[str, Any]
    nodes: NodeClients | None = None  # the owning nodes' gRPC APIs (CRD-1)

    async def tenant(self, credentials: HTTPAuthorizationCredentials | None) -> str:
        header = f"{credentials.scheme} {credentials.credentials}" if credentials is not None else None
        return await self.auth.tenant(header)

    async def owner_route(self, tenant: str, env_id: str) -> Route:
        """CRD-1: the owner from the route cache (the Ingress's, followed by the route stream) when it knows it,
        else from the Coordinator; while the Coordinator cannot be asked, a cached route of any age serves (the
        node checks ownership and generation itself, JRN-4)."""
        ingress = self.extras.get("ingress")
        cached = ingress.cached_route(tenant, env_id) if ingress is not None else None
        if cached is not None and cached.node_address:
            return cast(Route, cached)
        try:
            route = await self.coordinator.resolve_route(tenant, env_id)
        except UnavailableError:
            stale = ingress.cached_route(tenant, env_id, stale=True) if ingress is not None else None
            if stale is None or not stale.node_address:
                raise
            return cast(Route, stale)
        if ingress is not None:
            ingress.remember(tenant, route)
        return route

    async def node_view(self, tenant: str, env_id: str) -> NodeView | None:
        """The owning node's own view, found through the route cache (of any age): the answer while the
        Coordinator is away (JRN-4). None when no cached route names a node."""
        ingress = self.extras.get("ingress")
        cached = ingress.cached_route(tenant, env_id, stale=True) if ingress is not None else None
        if cached is None or not cached.node_address or self.nodes is None:
            return None
        return await self.nodes.describe(cached.node_address, tenant, env_id)

    def forget_route(self, tenant: str, env_id: str) -> None:
        ingress = self.extras.get("ingress")
        if ingress is not None:
            ingress.forget(tenant, env_id)

    async def environment_stats(self, tenant: str, env_id: str) -> EnvironmentStats:
        """The owning node's last usage sample (MET-1). A sleeping Environment is refused, never woken."""
        route = await self.coordinator.resolve_route(tenant, env_id)
        state = route.record.state
        if state is not EnvironmentState.RUNNING or not route.node_address or self.nodes is None:
            error = EnvironmentPausedError if state in DORMANT_STATES else ConflictError
            raise error(
                f"environment {env_id} is {state.value}: only a running Environment has usage to report",
                details={"state": state.value},
            )
        return await self.nodes.stats(route.node_address, tenant, env_id)

    async def close(self) -> None:
        for extra in self.extras.values():
            closer = getattr(extra, "close", None)
            if closer is not None:
                await closer()
        if self.nodes is not None:
            await self.nodes.close()
        await self.coordinator.close()


def plane(request: Request) -> Plane:
    return cast(Plane, request.app.state.plane)


def environment_id_or_404(environment_id: str) -> str:
    """A malformed ID cannot name any Environment: the same 404 as a missing or foreign one (SEC-2)."""
    try:
        return check_id("id", environment_id, ENVIRONMENT)
    except InvalidInputError:
        raise not_found(environment_id[:80]) from None


async def read_json(request: Request, limit: int) -> object:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InvalidInputError("body", f"is larger than {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise InvalidInputError("body", f"is larger than {limit} bytes")
    if not body:
        raise InvalidInputError("body", "is empty; expected a JSON object")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise InvalidInputError("body", f"is not valid JSON: {exc}") from None


def _idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not 0 < len(value) <= MAX_IDEMPOTENCY_KEY or not all(33 <= ord(c) <= 126 for c in value):
        raise InvalidInputError("Idempotency-Key", f"must be 1-{MAX_IDEMPOTENCY_KEY} visible ASCII characters")
    return value


router = APIRouter(tags=["environments"])


@router.post(
    "/v1/environments",
    status_code=201,
    response_model=EnvironmentView,
    responses={200: {"model": EnvironmentView, "description": "replay: the Idempotency-Key matched"}, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EnvironmentSpec"}}},
        }
    },
    summary="Create an Environment",
)
async def create_environment(
    request: Request,
    credentials: Credentials,
    idempotency_key: Annotated[
        str | None,
        Header(alias="Idempotency-Key", description="a retry with the same key returns the same Environment"),
    ] = None,
) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    key = _idempotency_key(idempotency_key)
    # ENV-5: the whole spec is validated here, before anything is sent anywhere; 422 names the field.
    spec = parse_wire(EnvironmentSpec, await read_json(request, p.config.max_body_bytes))
    record, created = await p.coordinator.create_environment(tenant, spec, key)
    log.info("environment created" if created else "create replayed", extra={"env_id": record.id, "tenant": tenant})
    return JSONResponse(
        EnvironmentView.of(record).wire(),
        status_code=201 if created else 200,
        headers={"Location": f"/v1/environments/{record.id}", "Idempotent-Replayed": str(not created).lower()},
    )


@router.get("/v1/environments", response_model=EnvironmentList, responses=ERRORS, summary="List Environments")
async def list_environments(request: Request, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    records = await p.coordinator.list_environments(tenant)
    records.sort(key=lambda r: (r.created_at, r.id))
    return JSONResponse({"environments": [EnvironmentView.of(r).wire() for r in records]})


@router.get("/v1/environments/{environment_id}", response_model=EnvironmentView, responses=ERRORS, summary="Get one")
async def get_environment(request: Request, environment_id: str, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    env_id = environment_id_or_404(environment_id)
    try:
        record = await p.coordinator.get_environment(tenant, env_id)
    except (UnavailableError, UncertainOutcomeError):
        # JRN-4/ENV-6: while the Coordinator is away, the owning node says what it holds, and whether a result
        # of it waits for publication; without a cached route the outage is the answer.
        view = await p.node_view(tenant, env_id)
        if view is None:
            raise
        body = EnvironmentView.of(view.record, publication_pending=view.publication_pending).wire()
        return JSONResponse(body, headers={"X-ADX-Answered-By": "node"})
    return JSONResponse(EnvironmentView.of(record).wire())


@router.delete(
    "/v1/environments/{environment_id}",
    response_model=EnvironmentView,
    responses=ERRORS,
    summary="Delete (state becomes deleting, then deleted; repeating it is harmless)",
)
async def delete_environment(request: Request, environment_id: str, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    record = await p.coordinator.delete_environment(tenant, environment_id_or_404(environment_id))
    log.info("environment delete requested", extra={"env_id": record.id, "tenant": tenant})
    return JSONResponse(EnvironmentView.of(record).wire())


@router.post(
    "/v1/environments/{environment_id}/pause",
    response_model=EnvironmentView,
    responses={**ERRORS, 409: {"model": ErrorBody, "description": "not running (e.g. already paused)"}},
    summary="Pause: checkpoint, publish, release resources; returns once paused (ENV-3)",
)
async def pause_environment(request: Request, environment_id: str, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    env_id = environment_id_or_404(environment_id)
    route = await p.owner_route(tenant, env_id)
    record = route.record
    if record.state is EnvironmentState.RUNNING and route.node_address and p.nodes is not None:
        # CRD-1: a node operation goes straight to the owning node; the node checks ownership and generation.
        wait = record.spec.lifecycle.effective_pause_options.wait_seconds
        try:
            record = await p.nodes.pause(route.node_address, record, wait_seconds=wait)
        except PublicationPendingError:
            raise  # the cluster still routes it to this node (JRN-4): the cached route stays
        except BaseException:
            p.forget_route(tenant, env_id)  # changing: the next request resolves it afresh
            raise
        p.forget_route(tenant, env_id)  # paused: the next request resolves it afresh
    else:
        # Not running here (or no node): the Coordinator answers with the authoritative state and reason.
        record = await p.coordinator.pause_environment(tenant, env_id)
    log.info("environment paused", extra={"env_id": record.id, "tenant": tenant})
    return JSONResponse(EnvironmentView.of(record).wire())


@router.get(
    "/v1/environments/{environment_id}/stats",
    response_model=EnvironmentStats,
    responses={**ERRORS, 409: {"model": ErrorBody, "description": "not running (a paused one is not woken)"}},
    summary="CPU, memory and disk usage of a running Environment, from its node's last sample (MET-1)",
)
async def environment_stats(request: Request, environment_id: str, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    stats = await p.environment_stats(tenant, environment_id_or_404(environment_id))
    return JSONResponse(stats.to_wire())


@router.post(
    "/v1/environments/{environment_id}/resume",
    response_model=EnvironmentView,
    responses={**ERRORS, 409: {"model": ErrorBody, "description": "neither paused nor running"}},
    summary="Resume a paused Environment (a running one is returned as it is); returns once running (CRD-5)",
)
async def resume_environment(request: Request, environment_id: str, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    route = await p.coordinator.ensure_running(
        tenant, environment_id_or_404(environment_id), p.config.wake_timeout_seconds
    )
    return JSONResponse(EnvironmentView.of(route.record).wire())


class LifetimeRequest(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    seconds: int = Field(ge=1, le=30 * 86_400, strict=True, description="the new deadline is now + seconds")
    action: Literal["delete", "pause"] | None = Field(default=None, description="default: keep the current one")


@router.post(
    "/v1/environments/{environment_id}/lifetime",
    response_model=EnvironmentView,
    responses=ERRORS,
    summary="Move the lifetime deadline (and optionally its action: delete or pause)",
)
async def set_lifetime(request: Request, environment_id: str, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    body = parse_wire(LifetimeRequest, await read_json(request, p.config.max_body_bytes))
    record = await p.coordinator.set_lifetime(
        tenant, environment_id_or_404(environment_id), float(body.seconds), body.action or ""
    )
    return JSONResponse(EnvironmentView.of(record).wire())


@router.post(
    "/v1/environments/{environment_id}/network",
    response_model=EnvironmentView,
    responses=ERRORS,
    summary="Replace the network policy (none, or egress with allow/deny lists); applied without a restart",
)
async def set_network(request: Request, environment_id: str, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    body = parse_wire(NetworkPolicy, await read_json(request, p.config.max_body_bytes), root="network")
    record = await p.coordinator.set_network(tenant, environment_id_or_404(environment_id), body)
    return JSONResponse(EnvironmentView.of(record).wire())


async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    spec = EnvironmentSpec.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in spec.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components["EnvironmentSpec"] = spec
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
            {},
            NodeClients(node_credentials, rpc_timeout=config.coordinator_timeout_seconds),
        )
        if with_ingress:
            from adx.ingress import Ingress

            ingress_plane = Ingress.from_config(config, coordinator)
            ingress_plane.start_following()
            p.extras["ingress"] = ingress_plane
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
        app.include_router(agent_router)
    if with_ingress:
        from adx.ingress import router as ingress_router

        app.include_router(ingress_router)
    if config.e2b:
        from adx.e2b import install

        install(app, control_plane=api, data_plane=with_ingress)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app
