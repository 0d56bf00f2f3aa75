"""Endpoint tokens (SEC-4): a credential scoped to one Environment's data plane (and optionally one of its ports),
so a tenant can hand a sandbox URL to its own end user without its API key.

Shared by the Coordinator (which stores them hashed), the API server (which issues them), the Ingress (which
checks them), the SDK and the CLI. No I/O here.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

from adx.model._base import INTEGRAL, ApiModel

#: Every endpoint token starts with this, so the Ingress tells it from a tenant key (``adxk_``) before any lookup
#: and a control-plane route refuses it with a message that says what it is.
ENDPOINT_TOKEN_PREFIX = "adxt_"
#: A token's ID: this and the first 12 hex digits of its hash. Names it in list/revoke; useless to guess it.
ENDPOINT_TOKEN_ID_PREFIX = "tok_"
ENDPOINT_TOKEN_ID_DIGITS = 12
#: The query parameter a browser link carries the token in (the Ingress answers with a cookie of the same name).
ENDPOINT_TOKEN_QUERY = "adx_token"
#: The longest lifetime a token may be given (a token without ``ttlSeconds`` never expires; revoke it).
MAX_ENDPOINT_TOKEN_TTL_SECONDS = 365 * 86_400
#: How many live tokens one Environment may have (bounded storage per Environment).
MAX_ENDPOINT_TOKENS = 1000

Port = Annotated[int, Strict(), Field(ge=1, le=65535), INTEGRAL]


def endpoint_token_id(digest: str) -> str:
    """The ID of the token whose SHA-256 hex digest is ``digest``."""
    return ENDPOINT_TOKEN_ID_PREFIX + digest[:ENDPOINT_TOKEN_ID_DIGITS]


def is_endpoint_token_id(value: str) -> bool:
    digits = value[len(ENDPOINT_TOKEN_ID_PREFIX) :]
    return (
        value.startswith(ENDPOINT_TOKEN_ID_PREFIX)
        and len(digits) == ENDPOINT_TOKEN_ID_DIGITS
        and all(c in "0123456789abcdef" for c in digits)
    )


class EndpointTokenRequest(ApiModel):
    """``POST /v1/environments/{id}/tokens``: what the new token may reach and for how long."""

    port: Port | None = Field(
        default=None, description="only this port's proxy (/ports/{port}/...); absent: the whole data plane"
    )
    ttl_seconds: (
        Annotated[float, Strict(), Field(gt=0, le=MAX_ENDPOINT_TOKEN_TTL_SECONDS, allow_inf_nan=False)] | None
    ) = Field(default=None, description="expires this many seconds after creation; absent: until revoked")


class EndpointTokenInfo(ApiModel):
    """A token as listed: never the secret (only its hash is stored)."""

    id: str = Field(description="names the token in revoke; not a secret")
    environment_id: str
    port: int | None = Field(default=None, description="the one port it reaches; null: the whole data plane")
    created_at: float = Field(description="unix time")
    expires_at: float | None = Field(default=None, description="unix time; null: until revoked")


class IssuedEndpointToken(EndpointTokenInfo):
    """A new token: the secret is in this answer only."""

    token: str = Field(description="the secret: `Authorization: Bearer <token>` or `?adx_token=<token>`")


class EndpointTokenList(ApiModel):
    tokens: list[EndpointTokenInfo]


class TokenGrant(ApiModel):
    """What a valid token lets its holder reach (the Coordinator's answer to the Ingress's check)."""

    token_id: str
    tenant: str
    environment_id: str
    port: int | None = None
    expires_at: float | None = None

    def allows_port(self, port: int | None) -> bool:
        """``port``: the port a request goes to, None for commands and files (the whole-data-plane routes)."""
        return self.port is None or self.port == port
