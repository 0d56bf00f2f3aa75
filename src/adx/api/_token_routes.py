"""Endpoint tokens (SEC-4): ``POST|GET /v1/environments/{id}/tokens`` and ``DELETE .../tokens/{token_id}``.

A tenant (with its API key; an endpoint token cannot mint tokens) issues a token that reaches one Environment's
data plane, or one port of it, optionally until an expiry; the holder uses it at the Ingress. Revoking takes
effect at once on this process and, through the Coordinator's route stream, on every other Ingress.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse

from adx.errors import InvalidInputError
from adx.gateway import ERRORS, Credentials, TenantEnv, TenantEnvironment, json_body, read_body, tenant_environment
from adx.ingress import TokenClient, serving_ingress
from adx.model import (
    EndpointTokenInfo,
    EndpointTokenList,
    EndpointTokenRequest,
    IssuedEndpointToken,
    parse_wire,
)

__all__ = ["token_router"]

token_router = APIRouter(tags=["endpoint tokens"], responses=ERRORS)

#: A token request is a tiny document: no reason to read more.
MAX_TOKEN_BODY_BYTES = 4096


async def _token_request(request: Request) -> EndpointTokenRequest:
    """The body, or no body at all (a token for the whole data plane that never expires)."""
    body = await read_body(request, MAX_TOKEN_BODY_BYTES)
    if not body.strip():
        return EndpointTokenRequest()
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise InvalidInputError("body", f"is not valid JSON: {exc}") from None
    return parse_wire(EndpointTokenRequest, data)


def _client(target: TenantEnvironment) -> TokenClient:
    p = target.plane
    return TokenClient(p.coordinator, timeout=p.config.coordinator_timeout_seconds)


@token_router.post(
    "/v1/environments/{environment_id}/tokens",
    status_code=201,
    response_model=IssuedEndpointToken,
    openapi_extra=json_body(EndpointTokenRequest, required=False),
    summary="Issue an endpoint token: its holder reaches this Environment's data plane (or one port), nothing else",
)
async def create_token(request: Request, t: TenantEnv) -> JSONResponse:
    spec = await _token_request(request)
    issued = await _client(t).create(t.tenant, t.env_id, spec)
    return JSONResponse(
        issued.to_wire(),
        status_code=201,
        headers={"Location": f"/v1/environments/{t.env_id}/tokens/{issued.id}", "Cache-Control": "no-store"},
    )


@token_router.get(
    "/v1/environments/{environment_id}/tokens",
    response_model=EndpointTokenList,
    summary="The Environment's live endpoint tokens (never their secrets)",
)
async def list_tokens(t: TenantEnv) -> JSONResponse:
    tokens = await _client(t).list(t.tenant, t.env_id)
    return JSONResponse(EndpointTokenList(tokens=tokens).to_wire())


@token_router.delete(
    "/v1/environments/{environment_id}/tokens/{token_id}",
    response_model=EndpointTokenInfo,
    summary="Revoke an endpoint token (refused by every Ingress from now on)",
)
async def revoke_token(
    request: Request,
    environment_id: str,
    token_id: Annotated[str, Path(pattern=r"^tok_[0-9a-f]{12}$", description="from the list or the create answer")],
    credentials: Credentials,
) -> JSONResponse:
    t = await tenant_environment(request, credentials, environment_id)
    revoked = await _client(t).revoke(t.tenant, t.env_id, token_id)
    ingress = serving_ingress(request.app)
    if ingress is not None:
        ingress.tokens.revoked(revoked.id)  # this process refuses it at once, before the route stream says so
    return JSONResponse(revoked.to_wire())
