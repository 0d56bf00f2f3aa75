"""``env.tokens``: endpoint tokens (SEC-4), sync and async. A token lets its holder reach this Environment's data
plane (or one port of it) and nothing else, so an end user gets a URL without the tenant's API key::

    token = env.tokens.create(port=8000, ttl=3600)
    link = env.tokens.url(token, "/")        # .../ports/8000/?adx_token=...: a browser keeps it as a cookie
    env.tokens.revoke(token)
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from adx.errors import InvalidInputError
from adx.model import (
    ENDPOINT_TOKEN_QUERY,
    MAX_ENDPOINT_TOKEN_TTL_SECONDS,
    EndpointTokenInfo,
    EndpointTokenList,
    IssuedEndpointToken,
)

if TYPE_CHECKING:
    from adx.sdk._async import AsyncClient
    from adx.sdk._client import Client


def token_body(port: int | None, ttl: float | timedelta | None) -> dict[str, Any]:
    """The request body, checked here so a bad argument names itself before any request is made."""
    body: dict[str, Any] = {}
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidInputError("port", f"must be a port number 1-65535, got {port!r}")
        body["port"] = port
    if ttl is not None:
        seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
            raise InvalidInputError("ttl", f"must be a positive number of seconds or a timedelta, got {ttl!r}")
        if seconds > MAX_ENDPOINT_TOKEN_TTL_SECONDS:
            raise InvalidInputError("ttl", f"must be at most {MAX_ENDPOINT_TOKEN_TTL_SECONDS} seconds (365 days)")
        body["ttlSeconds"] = seconds
    return body


def token_id_of(token: str | EndpointTokenInfo) -> str:
    return token.id if isinstance(token, EndpointTokenInfo) else token


def token_url(api_url: str, environment_id: str, token: IssuedEndpointToken, path: str, port: int | None) -> str:
    """A link for a browser: the port's proxy URL with ``?adx_token=`` (the Ingress answers with a cookie)."""
    port = token.port if port is None else port
    if port is None:
        raise InvalidInputError("port", "name the port: this token is not scoped to one")
    path = path.lstrip("/")
    base = f"{api_url.rstrip('/')}/v1/environments/{environment_id}/ports/{port}/{quote(path)}"
    return f"{base}?{urlencode({ENDPOINT_TOKEN_QUERY: token.token})}"


class Tokens:
    """An Environment's endpoint tokens (``env.tokens``)."""

    def __init__(self, client: Client, environment_id: str) -> None:
        self._client = client
        self._id = environment_id

    def create(self, *, port: int | None = None, ttl: float | timedelta | None = None) -> IssuedEndpointToken:
        """A new token (its secret is in ``.token``, shown only now). ``port``: only that port's proxy;
        ``ttl``: seconds (or a timedelta) until it expires, None: until revoked."""
        response = self._client.request(
            "POST",
            f"/v1/environments/{self._id}/tokens",
            what=f"create a token for {self._id}",
            idempotent=False,
            json=token_body(port, ttl),
        )
        return IssuedEndpointToken.model_validate(response.json())

    def list(self) -> list[EndpointTokenInfo]:
        """The live tokens (IDs, scope, expiry; never their secrets)."""
        response = self._client.request(
            "GET", f"/v1/environments/{self._id}/tokens", what=f"list the tokens of {self._id}", idempotent=True
        )
        return EndpointTokenList.model_validate(response.json()).tokens

    def revoke(self, token: str | EndpointTokenInfo) -> EndpointTokenInfo:
        """Revoke a token (by ID or as returned by create/list): every Ingress refuses it from now on."""
        token_id = token_id_of(token)
        response = self._client.request(
            "DELETE",
            f"/v1/environments/{self._id}/tokens/{token_id}",
            what=f"revoke token {token_id} of {self._id}",
            idempotent=True,
        )
        return EndpointTokenInfo.model_validate(response.json())

    def url(self, token: IssuedEndpointToken, path: str = "/", *, port: int | None = None) -> str:
        """A browser link to ``path`` on the token's port (or ``port``) carrying the token."""
        return token_url(self._client.api_url, self._id, token, path, port)


class AsyncTokens:
    """``Tokens`` for the AsyncClient."""

    def __init__(self, client: AsyncClient, environment_id: str) -> None:
        self._client = client
        self._id = environment_id

    async def create(self, *, port: int | None = None, ttl: float | timedelta | None = None) -> IssuedEndpointToken:
        response = await self._client.request(
            "POST",
            f"/v1/environments/{self._id}/tokens",
            what=f"create a token for {self._id}",
            idempotent=False,
            json=token_body(port, ttl),
        )
        return IssuedEndpointToken.model_validate(response.json())

    async def list(self) -> list[EndpointTokenInfo]:
        response = await self._client.request(
            "GET", f"/v1/environments/{self._id}/tokens", what=f"list the tokens of {self._id}", idempotent=True
        )
        return EndpointTokenList.model_validate(response.json()).tokens

    async def revoke(self, token: str | EndpointTokenInfo) -> EndpointTokenInfo:
        token_id = token_id_of(token)
        response = await self._client.request(
            "DELETE",
            f"/v1/environments/{self._id}/tokens/{token_id}",
            what=f"revoke token {token_id} of {self._id}",
            idempotent=True,
        )
        return EndpointTokenInfo.model_validate(response.json())

    def url(self, token: IssuedEndpointToken, path: str = "/", *, port: int | None = None) -> str:
        return token_url(self._client.api_url, self._id, token, path, port)
