"""Endpoint tokens at the Ingress (SEC-4): where a request carries one, what it may reach, and the Coordinator's
token calls (shared with the API server's token routes).

A token comes in ``Authorization: Bearer adxt_...``, else in the ``?adx_token=`` query (a link handed to a
browser; the answer sets a cookie so the page's own requests carry it), else in that cookie. A tenant API key in
the header wins over a query or cookie token. Checked answers are cached by the token's hash: for
``auth_cache_seconds`` while the Coordinator's route stream is followed (revocations arrive on it and drop the
entry at once), else for ``route_cache_seconds``; never past the token's own expiry.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from enum import StrEnum

from fastapi.security import HTTPAuthorizationCredentials
from starlette.requests import HTTPConnection
from starlette.responses import Response

from adx.errors import ForbiddenError, NotFoundError
from adx.gateway import CoordinatorClient, Unauthenticated
from adx.model import (
    ENDPOINT_TOKEN_PREFIX,
    ENDPOINT_TOKEN_QUERY,
    EndpointTokenInfo,
    EndpointTokenRequest,
    IssuedEndpointToken,
    TokenGrant,
    parse_wire,
)
from adx.proto import tokens_pb2 as pb

#: A token longer than this is no token of ours (refused before hashing or asking anyone).
MAX_TOKEN_LENGTH = 512
MAX_CACHED = 10_000


class TokenSource(StrEnum):
    HEADER = "header"
    QUERY = "query"
    COOKIE = "cookie"


@dataclass(frozen=True)
class PresentedToken:
    token: str
    source: TokenSource


def presented_token(request: HTTPConnection, credentials: HTTPAuthorizationCredentials | None) -> PresentedToken | None:
    """The endpoint token this request carries, None when it carries a tenant key (or nothing)."""
    if credentials is not None:
        bearer = credentials.credentials.strip()
        return PresentedToken(bearer, TokenSource.HEADER) if bearer.startswith(ENDPOINT_TOKEN_PREFIX) else None
    if request.headers.get("authorization"):
        return None  # a malformed header: the tenant check explains it
    query = request.query_params.get(ENDPOINT_TOKEN_QUERY)
    if query:
        return PresentedToken(query, TokenSource.QUERY)
    cookie = request.cookies.get(ENDPOINT_TOKEN_QUERY)
    if cookie:
        return PresentedToken(cookie, TokenSource.COOKIE)
    return None


def check_scope(grant: TokenGrant, environment_id: str, port: int | None) -> None:
    """403 unless the token reaches this Environment and, when port-scoped, this port (SEC-4: checked before any
    route lookup or wake-up)."""
    if grant.environment_id != environment_id:
        raise ForbiddenError(
            "Authorization", f"endpoint token {grant.token_id} reaches only its own Environment, not {environment_id}"
        )
    if not grant.allows_port(port):
        where = "commands and files" if port is None else f"port {port}"
        raise ForbiddenError(
            "Authorization",
            f"endpoint token {grant.token_id} reaches only port {grant.port} of {environment_id}, not {where}",
        )


def set_token_cookie(response: Response, request: HTTPConnection, presented: PresentedToken, grant: TokenGrant) -> None:
    """A token that came in the query is kept by the browser for the pages it reaches (only those paths)."""
    if presented.source is not TokenSource.QUERY:
        return
    # The page's URL holds the token: its links and subresources must not send it on in a Referer.
    response.headers["Referrer-Policy"] = "no-referrer"
    path = f"/v1/environments/{grant.environment_id}/"
    if grant.port is not None:
        path += f"ports/{grant.port}/"
    max_age = None if grant.expires_at is None else max(0, int(grant.expires_at - time.time()))
    response.set_cookie(
        ENDPOINT_TOKEN_QUERY,
        presented.token,
        max_age=max_age,
        path=path,
        secure=request.url.scheme == "https",
        httponly=True,  # the page's scripts never read it
        samesite="lax",
    )


def without_token_query(query: str) -> str:
    """The query string minus ``adx_token`` (the token never reaches the workload)."""
    if ENDPOINT_TOKEN_QUERY not in query:
        return query
    kept = [part for part in query.split("&") if part.partition("=")[0] != ENDPOINT_TOKEN_QUERY]
    return "&".join(kept)


class TokenClient:
    """The Coordinator's ``CoordinatorTokens`` calls, typed, with the client's error translation."""

    def __init__(self, coordinator: CoordinatorClient, *, timeout: float) -> None:
        self._coordinator = coordinator
        self._timeout = timeout

    async def create(self, tenant: str, env_id: str, request: EndpointTokenRequest) -> IssuedEndpointToken:
        message = pb.CreateTokenRequest(
            tenant=tenant, environment_id=env_id, request_json=request.model_dump_json(by_alias=True)
        )
        reply = await self._coordinator.call(
            "create endpoint token",
            lambda: self._coordinator.tokens.CreateToken(message, timeout=self._timeout),
            reads=False,
        )
        return parse_wire(IssuedEndpointToken, json.loads(reply.json))

    async def list(self, tenant: str, env_id: str) -> list[EndpointTokenInfo]:
        message = pb.EnvironmentTokensRequest(tenant=tenant, environment_id=env_id)
        reply = await self._coordinator.call(
            "list endpoint tokens",
            lambda: self._coordinator.tokens.ListTokens(message, timeout=self._timeout),
            reads=True,
        )
        return [parse_wire(EndpointTokenInfo, json.loads(text)) for text in reply.json]

    async def revoke(self, tenant: str, env_id: str, token_id: str) -> EndpointTokenInfo:
        message = pb.RevokeTokenRequest(tenant=tenant, environment_id=env_id, token_id=token_id)
        reply = await self._coordinator.call(
            "revoke endpoint token",
            lambda: self._coordinator.tokens.RevokeToken(message, timeout=self._timeout),
            reads=False,
        )
        return parse_wire(EndpointTokenInfo, json.loads(reply.json))

    async def check(self, token: str) -> TokenGrant:
        message = pb.CheckTokenRequest(token=token)
        reply = await self._coordinator.call(
            "check endpoint token",
            lambda: self._coordinator.tokens.CheckToken(message, timeout=self._timeout),
            reads=True,
        )
        return parse_wire(TokenGrant, json.loads(reply.json))


class TokenCache:
    """token hash -> (grant, expiry). Keyed by a digest, so raw tokens are not kept longer than a request."""

    def __init__(self, client: TokenClient, *, followed_ttl: float, unfollowed_ttl: float) -> None:
        self._client = client
        self._followed_ttl = followed_ttl
        self._unfollowed_ttl = unfollowed_ttl
        self._cache: dict[bytes, tuple[TokenGrant, float]] = {}
        self.lookups = 0  # Coordinator checks made (cache misses): read by tests and the bench

    async def grant(self, token: str, *, following: bool) -> TokenGrant:
        if len(token) > MAX_TOKEN_LENGTH or not token.startswith(ENDPOINT_TOKEN_PREFIX):
            raise Unauthenticated("unknown endpoint token")
        digest = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        self.lookups += 1
        try:
            grant = await self._client.check(token)
        except NotFoundError as exc:
            self._cache.pop(digest, None)
            raise Unauthenticated(exc.message) from None
        ttl = self._followed_ttl if following else self._unfollowed_ttl
        if grant.expires_at is not None:
            ttl = min(ttl, grant.expires_at - time.time())
        if ttl > 0:
            if len(self._cache) >= MAX_CACHED:
                # Bounded memory: drop everything expired, and if that is not enough, start over.
                self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
                if len(self._cache) >= MAX_CACHED:
                    self._cache.clear()
            self._cache[digest] = (grant, now + ttl)
        return grant

    def revoked(self, token_id: str) -> None:
        """A revocation (from the route stream, or made through this process): refused from now on."""
        self._cache = {k: v for k, v in self._cache.items() if v[0].token_id != token_id}

    def forget_all(self) -> None:
        """The route stream (re)started: revocations may have been missed meanwhile."""
        self._cache.clear()
