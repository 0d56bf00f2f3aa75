"""The request context every HTTP front door shares: the :class:`Plane` (Coordinator client, tenant cache, node
clients, route cache), authentication as a FastAPI dependency, the ID and body readers.

The API routes, the Ingress's data-plane routes and the E2B layer all read it; it knows none of them (the route
cache is the :class:`RouteCache` protocol, which the Ingress satisfies), so the packages above depend on it and
never on each other's request handling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Protocol, cast

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from adx._node_client import NodeClients, NodeView
from adx.errors import ConflictError, EnvironmentPausedError, InvalidInputError, UnavailableError
from adx.gateway._auth import TenantAuth
from adx.gateway._config import ApiConfig
from adx.gateway._coordinator import CoordinatorClient, Route
from adx.gateway._errors import not_found
from adx.gateway._openapi import OpenApiResponses, error_answer
from adx.model import DORMANT_STATES, ENVIRONMENT, NODE_IMAGES, EnvironmentState, EnvironmentStats, check_id


class RouteCache(Protocol):
    """The Ingress's cache of owning nodes, followed from the Coordinator's route stream."""

    def cached_route(self, tenant: str, environment_id: str, *, stale: bool = False) -> Route | None: ...

    def remember(self, tenant: str, route: Route) -> None: ...

    def forget(self, tenant: str, environment_id: str) -> None: ...

    #: The route stream is followed now: every commit is heard (``state_published`` wakes at once).
    following: bool

    async def state_published(
        self, tenant: str, environment_id: str, *, after_revision: int, leaving: frozenset[str], within: float
    ) -> bool: ...

    async def close(self) -> None: ...


bearer = HTTPBearer(auto_error=False, description="a tenant API key (`adx tenant create NAME` prints one)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]

ERRORS: OpenApiResponses = {
    401: error_answer("missing or unknown API key"),
    404: error_answer("no such Environment for this tenant"),
    422: error_answer("invalid input; details.field names the camelCase path"),
    503: error_answer("no capacity (code no_capacity) or the Coordinator is unavailable"),
    504: error_answer("outcome uncertain: retry with the same Idempotency-Key"),
}


@dataclass
class Plane:
    """What the request handlers share: the Coordinator client, the tenant cache, the owning nodes' clients and,
    where this process serves the data plane, the Ingress's route cache."""

    config: ApiConfig
    coordinator: CoordinatorClient
    auth: TenantAuth
    nodes: NodeClients | None = None  # the owning nodes' gRPC APIs (CRD-1)
    routes: RouteCache | None = None

    async def tenant(self, credentials: HTTPAuthorizationCredentials | None) -> str:
        header = f"{credentials.scheme} {credentials.credentials}" if credentials is not None else None
        return await self.auth.tenant(header)

    async def owner_route(self, tenant: str, env_id: str) -> Route:
        """CRD-1: the owner from the route cache (the Ingress's, followed by the route stream) when it knows it,
        else from the Coordinator; while the Coordinator cannot be asked, a cached route of any age serves (the
        node checks ownership and generation itself, JRN-4)."""
        ingress = self.routes
        cached = ingress.cached_route(tenant, env_id) if ingress is not None else None
        if cached is not None and cached.node_address:
            return cached
        try:
            route = await self.coordinator.resolve_route(tenant, env_id)
        except UnavailableError:
            stale = ingress.cached_route(tenant, env_id, stale=True) if ingress is not None else None
            if stale is None or not stale.node_address:
                raise
            return stale
        if ingress is not None:
            ingress.remember(tenant, route)
        return route

    async def node_view(self, tenant: str, env_id: str) -> NodeView | None:
        """The owning node's own view, found through the route cache (of any age): the answer while the
        Coordinator is away (JRN-4). None when no cached route names a node."""
        ingress = self.routes
        cached = ingress.cached_route(tenant, env_id, stale=True) if ingress is not None else None
        if cached is None or not cached.node_address or self.nodes is None:
            return None
        return await self.nodes.describe(cached.node_address, tenant, env_id)

    def check_image(self, name: str, field: str) -> None:
        """422 naming ``field`` when the configured image store lacks image ``name`` (``base``/``host``: the
        nodes' default, always there)."""
        images = self.config.images_dir
        if images is None or name in NODE_IMAGES:
            return
        from adx.images import ImageStore

        if ImageStore(images / "store").find(name) is None:
            raise InvalidInputError(field, f"no image named {name!r} (adx image list shows the images)")

    def forget_route(self, tenant: str, env_id: str) -> None:
        ingress = self.routes
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
        if self.routes is not None:
            await self.routes.close()
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


@dataclass(frozen=True)
class TenantEnvironment:
    """The Environment a tenant's request names: the plane to act through, the tenant its key names, the ID."""

    plane: Plane
    tenant: str
    env_id: str


async def tenant_environment(request: Request, credentials: Credentials, environment_id: str) -> TenantEnvironment:
    """The key first (401), then the ID (a malformed one: 404), before anything is asked of anyone."""
    p = plane(request)
    tenant = await p.tenant(credentials)
    return TenantEnvironment(p, tenant, environment_id_or_404(environment_id))


#: :func:`tenant_environment` as a route's dependency (``{environment_id}`` and the key). FastAPI solves a
#: dependency before it validates the route's own parameters, so a route with query parameters of its own calls
#: the function itself instead: an invalid parameter stays a 422 whatever the key and the ID.
TenantEnv = Annotated[TenantEnvironment, Depends(tenant_environment)]


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body; over ``limit`` bytes (as declared, or as it streams) is a 422 naming ``body``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InvalidInputError("body", f"is larger than {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise InvalidInputError("body", f"is larger than {limit} bytes")
    return bytes(body)


async def read_json(request: Request, limit: int) -> object:
    body = await read_body(request, limit)
    if not body:
        raise InvalidInputError("body", "is empty; expected a JSON object")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise InvalidInputError("body", f"is not valid JSON: {exc}") from None
