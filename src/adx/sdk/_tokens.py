"""``env.tokens``: endpoint tokens (SEC-4), sync and async. A token lets its holder reach this Environment's data
plane (or one port of it) and nothing else, so an end user gets a URL without the tenant's API key::

    token = env.tokens.create(port=8000, ttl=3600)
    link = env.tokens.url(token, "/")        # .../ports/8000/?adx_token=...: a browser keeps it as a cookie
    env.tokens.revoke(token)
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Generic, TypedDict
from urllib.parse import quote, urlencode

from adx.errors import InvalidInputError
from adx.model import (
    ENDPOINT_TOKEN_QUERY,
    MAX_ENDPOINT_TOKEN_TTL_SECONDS,
    EndpointTokenInfo,
    EndpointTokenList,
    IssuedEndpointToken,
)
from adx.sdk._calls import C, Call, Plan, json_of

if TYPE_CHECKING:
    from adx.sdk._async import AsyncClient  # noqa: F401 (the faces' base classes name it)
    from adx.sdk._client import Client  # noqa: F401


class TokenBody(TypedDict, total=False):
    """``POST .../tokens``: the port it is scoped to (else the whole data plane) and its lifetime (else until
    revoked)."""

    port: int
    ttlSeconds: float


def token_body(port: int | None, ttl: float | timedelta | None) -> TokenBody:
    """The request body, checked here so a bad argument names itself before any request is made."""
    body: TokenBody = {}
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


class _TokensCore(Generic[C]):
    """Both faces' requests and answers (``adx.sdk._calls`` plans); each face carries them out."""

    def __init__(self, client: C, environment_id: str) -> None:
        self._client = client
        self._id = environment_id
        self._path = f"/v1/environments/{environment_id}/tokens"

    def _create(self, port: int | None, ttl: float | timedelta | None) -> Plan[IssuedEndpointToken]:
        body = token_body(port, ttl)
        call = Call("POST", self._path, what=f"create a token for {self._id}", idempotent=False, json=body)
        return IssuedEndpointToken.model_validate((yield from json_of(self._client, call)))

    def _list(self) -> Plan[list[EndpointTokenInfo]]:
        call = Call("GET", self._path, what=f"list the tokens of {self._id}", idempotent=True)
        return EndpointTokenList.model_validate((yield from json_of(self._client, call))).tokens

    def _revoke(self, token: str | EndpointTokenInfo) -> Plan[EndpointTokenInfo]:
        token_id = token_id_of(token)
        path, what = f"{self._path}/{token_id}", f"revoke token {token_id} of {self._id}"
        return EndpointTokenInfo.model_validate(
            (yield from json_of(self._client, Call("DELETE", path, what=what, idempotent=True)))
        )

    def url(self, token: IssuedEndpointToken, path: str = "/", *, port: int | None = None) -> str:
        """A browser link to ``path`` on the token's port (or ``port``) carrying the token."""
        return token_url(self._client.api_url, self._id, token, path, port)


class Tokens(_TokensCore["Client"]):
    """An Environment's endpoint tokens (``env.tokens``)."""

    def create(self, *, port: int | None = None, ttl: float | timedelta | None = None) -> IssuedEndpointToken:
        """A new token (its secret is in ``.token``, shown only now). ``port``: only that port's proxy;
        ``ttl``: seconds (or a timedelta) until it expires, None: until revoked."""
        return self._client.run(self._create(port, ttl))

    def list(self) -> list[EndpointTokenInfo]:
        """The live tokens (IDs, scope, expiry; never their secrets)."""
        return self._client.run(self._list())

    def revoke(self, token: str | EndpointTokenInfo) -> EndpointTokenInfo:
        """Revoke a token (by ID or as returned by create/list): every Ingress refuses it from now on."""
        return self._client.run(self._revoke(token))


class AsyncTokens(_TokensCore["AsyncClient"]):
    """``Tokens`` for the AsyncClient."""

    async def create(self, *, port: int | None = None, ttl: float | timedelta | None = None) -> IssuedEndpointToken:
        return await self._client.run(self._create(port, ttl))

    async def list(self) -> list[EndpointTokenInfo]:
        return await self._client.run(self._list())

    async def revoke(self, token: str | EndpointTokenInfo) -> EndpointTokenInfo:
        return await self._client.run(self._revoke(token))
