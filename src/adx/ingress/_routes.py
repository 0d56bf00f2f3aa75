"""Data-plane routes: ``/v1/environments/{id}/commands``, ``/files``, ``/ports`` (mapped to execd's routes).

Each takes the tenant's API key or an endpoint token of that Environment (SEC-4, ``_tokens``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, cast

from fastapi import APIRouter, Path, Request
from fastapi.security import HTTPAuthorizationCredentials
from starlette.responses import StreamingResponse

from adx.errors import InvalidInputError
from adx.gateway import ERRORS, Credentials, environment_id_or_404, plane
from adx.ingress._ingress import Ingress, serving_ingress
from adx.ingress._tokens import PresentedToken, check_scope, presented_token, set_token_cookie
from adx.model import TokenGrant

router = APIRouter(tags=["data plane"])


def route(path: str, methods: list[str], **options: Any) -> Callable[[F], F]:
    """One route per method, so every operation gets its own OpenAPI operation ID."""

    def register(fn: F) -> F:
        for method in methods:
            router.add_api_route(path, fn, methods=[method], name=f"{fn.__name__}_{method.lower()}", **options)
        return fn

    return register


F = TypeVar("F", bound=Callable[..., Any])
EnvId = Annotated[str, Path(description="the Environment's ID")]
DATA_ERRORS = {
    **ERRORS,
    403: {"description": "an endpoint token of another Environment, or of another port (code forbidden)"},
    409: {"description": "the Environment is not running (code not_running)"},
    502: {"description": "the node's Relay failed"},
}


@dataclass(frozen=True)
class Access:
    """Who a data-plane request acts for, and the endpoint token it came with (if any)."""

    ingress: Ingress
    tenant: str
    env_id: str
    token: tuple[PresentedToken, TokenGrant] | None = None

    async def forward(
        self, request: Request, execd_path: str, *, body: bytes | None = None, read_timeout: float | None
    ) -> StreamingResponse:
        response = await self.ingress.forward(
            request, self.tenant, self.env_id, execd_path, body=body, read_timeout=read_timeout
        )
        if self.token is not None:
            set_token_cookie(response, request, *self.token)
        return response


async def _setup(request: Request, credentials: object, environment_id: str, port: int | None = None) -> Access:
    """SEC-4: the tenant key, or the endpoint token and its scope (this Environment; this port when it is
    port-scoped), is checked before any route lookup, wake-up or forwarding."""
    ingress = serving_ingress(request.app)
    if ingress is None:  # the routes are mounted only with an Ingress (create_app)
        raise RuntimeError("the data-plane routes are served without an Ingress")
    bearer = cast(HTTPAuthorizationCredentials | None, credentials)
    presented = presented_token(request, bearer)
    if presented is None:
        tenant = await plane(request).tenant(bearer)
        return Access(ingress, tenant, environment_id_or_404(environment_id))
    grant = await ingress.tokens.grant(presented.token, following=ingress.following)
    env_id = environment_id_or_404(environment_id)
    check_scope(grant, env_id, port)
    return Access(ingress, grant.tenant, env_id, (presented, grant))


async def _small_body(request: Request) -> bytes:
    limit = plane(request).config.max_body_bytes
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise InvalidInputError("body", f"is larger than {limit} bytes")
    return bytes(body)


@router.post(
    "/v1/environments/{environment_id}/commands",
    responses={200: {"content": {"application/x-ndjson": {}}}, **DATA_ERRORS},
    summary="Run a command; streams NDJSON frames as output is produced",
    description=(
        'Body: `{"command": "echo hi"}` (shell) or `{"argv": [...]}`, optional `env`, `cwd`, `timeoutSeconds`, '
        '`stdin`, `background`. Frames: `{"id","pid"}`, then `{"stream","data"}` as produced, then '
        '`{"exitCode","signal","timedOut"}`.'
    ),
)
async def run_command(request: Request, environment_id: EnvId, credentials: Credentials) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    body = await _small_body(request)  # a small JSON document: buffered, so a retry after a connect failure is safe
    # No read timeout: a command may be silent for long; its own timeoutSeconds bounds it, and a caller that
    # hangs up cancels it (execd kills a foreground command whose client has gone).
    return await a.forward(request, "/v1/commands", body=body, read_timeout=None)


@router.get("/v1/environments/{environment_id}/commands", responses=DATA_ERRORS, summary="List commands")
async def list_commands(request: Request, environment_id: EnvId, credentials: Credentials) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    return await a.forward(request, "/v1/commands", body=b"", read_timeout=None)


@route(
    "/v1/environments/{environment_id}/commands/{command_id}",
    methods=["GET", "DELETE"],
    responses=DATA_ERRORS,
    summary="A background command's status (GET) or forget a finished one (DELETE)",
)
async def command(
    request: Request, environment_id: EnvId, command_id: str, credentials: Credentials
) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    return await a.forward(request, f"/v1/commands/{command_id}", body=b"", read_timeout=None)


@route(
    "/v1/environments/{environment_id}/commands/{command_id}/{action}",
    methods=["GET", "POST"],
    responses=DATA_ERRORS,
    summary="output (GET), kill (POST), stdin (POST, raw body streamed)",
)
async def command_action(
    request: Request, environment_id: EnvId, command_id: str, action: str, credentials: Credentials
) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    path = f"/v1/commands/{command_id}/{action}"
    body = None if action == "stdin" else await _small_body(request)
    return await a.forward(request, path, body=body, read_timeout=None)


@route(
    "/v1/environments/{environment_id}/files",
    methods=["GET", "PUT", "DELETE"],
    responses={200: {"content": {"application/octet-stream": {}}}, **DATA_ERRORS},
    summary="Read (GET), write (PUT, raw body) or delete (DELETE) the file at ?path=",
)
async def files(request: Request, environment_id: EnvId, credentials: Credentials) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    body = None if request.method == "PUT" else b""  # file contents stream through, never buffered here
    timeout = plane(request).config.relay_timeout_seconds
    return await a.forward(request, "/v1/files", body=body, read_timeout=timeout)


@route(
    "/v1/environments/{environment_id}/files/{action}",
    methods=["GET", "POST"],
    responses=DATA_ERRORS,
    summary="stat (GET), list (GET), mkdir (POST) at ?path=",
)
async def files_action(
    request: Request, environment_id: EnvId, action: str, credentials: Credentials
) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    timeout = plane(request).config.relay_timeout_seconds
    body = await _small_body(request)
    return await a.forward(request, f"/v1/files/{action}", body=body, read_timeout=timeout)


@route(
    "/v1/environments/{environment_id}/ports/{port}/{path:path}",
    methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
    responses=DATA_ERRORS,
    summary="Proxy to a service the Environment listens on (inside its own network namespace)",
)
async def ports(
    request: Request, environment_id: EnvId, port: int, path: str, credentials: Credentials
) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id, port)
    if not 1 <= port <= 65535:
        raise InvalidInputError("port", "must be 1-65535")
    timeout = plane(request).config.relay_timeout_seconds
    return await a.forward(request, f"/port/{port}/{path}", read_timeout=timeout)
