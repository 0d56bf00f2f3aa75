"""Endpoint tokens in Redis (SEC-4): only SHA-256 hashes of tokens are stored, each write is one fenced Lua script.

Keys: ``adx:etoken:<hash>`` (a hash: id, tenant, env, port, created_at, expires_at) and the Environment's index
``adx:env-tokens:<env>`` (token ID -> hash, for list and revoke). A token with an expiry also gets a Redis
expiry a day after it, so expired tokens are reclaimed by Redis while a late use still hears "expired" rather than
"unknown". A revocation is published on the route channel in the same script, so every Ingress following the
Coordinator's route stream drops the token from its cache at once. The tokens of a deleted Environment are
reclaimed by ``sweep`` (the Coordinator runs it every minute): revoked in the same way, their keys gone.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

from adx.coordinator._keys import ROUTES_CHANNEL, env_key, env_tokens_key, token_key
from adx.coordinator._redis_store import ScriptArg, _text
from adx.coordinator._scripts import fenced
from adx.coordinator._store import CoordinatorStore, hash_api_key, new_api_key
from adx.errors import ConflictError, NotFoundError
from adx.model import (
    ENDPOINT_TOKEN_PREFIX,
    MAX_ENDPOINT_TOKENS,
    EndpointTokenInfo,
    EndpointTokenRequest,
    IssuedEndpointToken,
    TokenGrant,
    endpoint_token_id,
)

#: How long after its expiry an expired token's record is kept (a use in that window is told "expired").
EXPIRED_KEPT_SECONDS = 86_400
#: The route channel message field that carries a revoked token's ID (WatchRoutes turns it into a RouteEvent).
REVOKED_FIELD = "revokedToken"


# KEYS: environment, token, the Environment's token index
# ARGV: tenant, token id, digest, env id, port ('' = any), created_at, expires_at ('' = never),
#       redis expiry in unix ms ('0' = none), max tokens per Environment
CREATE_TOKEN = fenced(
    """
local env = redis.call('HMGET', KEYS[1], 'tenant', 'state')
if env[1] ~= ARGV[1] or env[2] == 'deleting' or env[2] == 'deleted' then return {-1, 'unknown environment'} end
if redis.call('HLEN', KEYS[3]) >= tonumber(ARGV[9]) then return {-2, 'too many tokens'} end
redis.call('HSET', KEYS[2], 'id', ARGV[2], 'tenant', ARGV[1], 'env', ARGV[4], 'port', ARGV[5],
           'created_at', ARGV[6], 'expires_at', ARGV[7])
if ARGV[8] ~= '0' then redis.call('PEXPIREAT', KEYS[2], ARGV[8]) end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
return {1, ''}
"""
)

# KEYS: the Environment's token index, token   ARGV: token id, digest, the route-channel message
REVOKE_TOKEN = fenced(
    """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return {-1, 'unknown token'} end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', '"""
    + ROUTES_CHANNEL
    + """', ARGV[3])
return {1, ''}
"""
)


# The tokens of a deleted (or vanished) Environment, all at once.
# KEYS: environment, the Environment's token index, its tokens...   ARGV: one route-channel message per token
FORGET_TOKENS = fenced(
    """
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'deleted' then return {-1, state} end
redis.call('DEL', KEYS[2])
for i = 3, #KEYS - 1 do
  redis.call('DEL', KEYS[i])
  redis.call('PUBLISH', '"""
    + ROUTES_CHANNEL
    + """', ARGV[i - 2])
end
return {1, tostring(#KEYS - 3)}
"""
)
ENV_TOKENS_PATTERN = env_tokens_key("*")


def _info(fields: dict[str, str]) -> EndpointTokenInfo:
    return EndpointTokenInfo(
        id=fields["id"],
        environment_id=fields["env"],
        port=int(fields["port"]) if fields.get("port") else None,
        created_at=float(fields["created_at"]),
        expires_at=float(fields["expires_at"]) if fields.get("expires_at") else None,
    )


class TokenStore:
    def __init__(self, store: CoordinatorStore) -> None:
        self._store = store
        self._redis = store._redis
        self._create = self._redis.register_script(CREATE_TOKEN)
        self._revoke = self._redis.register_script(REVOKE_TOKEN)
        self._forget = self._redis.register_script(FORGET_TOKENS)

    async def create(self, tenant: str, env_id: str, request: EndpointTokenRequest) -> IssuedEndpointToken:
        token, digest = new_api_key(ENDPOINT_TOKEN_PREFIX)
        now = time.time()
        expires_at = now + request.ttl_seconds if request.ttl_seconds is not None else None
        info = EndpointTokenInfo(
            id=endpoint_token_id(digest),
            environment_id=env_id,
            port=request.port,
            created_at=now,
            expires_at=expires_at,
        )
        redis_expiry_ms = round((expires_at + EXPIRED_KEPT_SECONDS) * 1000) if expires_at is not None else 0
        status, _ = await self._store._script(
            "create endpoint token",
            self._create,
            [env_key(env_id), token_key(digest), env_tokens_key(env_id)],
            [
                tenant,
                info.id,
                digest,
                env_id,
                "" if request.port is None else str(request.port),
                repr(now),
                "" if expires_at is None else repr(expires_at),
                redis_expiry_ms,
                MAX_ENDPOINT_TOKENS,
            ],
        )
        if status == -1:
            raise NotFoundError(f"environment {env_id} not found")
        if status == -2:
            raise ConflictError(
                f"environment {env_id} has {MAX_ENDPOINT_TOKENS} endpoint tokens already; revoke some first"
            )
        return IssuedEndpointToken(**info.model_dump(), token=token)

    async def list(self, env_id: str) -> list[EndpointTokenInfo]:
        """The Environment's live tokens (expired ones are left out), oldest first."""

        async def read() -> list[dict[bytes, bytes]]:
            digests = await self._redis.hvals(env_tokens_key(env_id))
            if not digests:
                return []
            async with self._redis.pipeline(transaction=False) as pipe:
                for digest in digests:
                    pipe.hgetall(token_key(_text(digest)))
                found: list[dict[bytes, bytes]] = await pipe.execute()
            return found

        now = time.time()
        tokens = []
        for raw in await self._store._call("list endpoint tokens", read, writes=False):
            if raw:
                info = _info({_text(k): _text(v) for k, v in raw.items()})
                if info.expires_at is None or info.expires_at > now:
                    tokens.append(info)
        return sorted(tokens, key=lambda t: (t.created_at, t.id))

    async def revoke(self, env_id: str, token_id: str) -> EndpointTokenInfo:
        """Revoke at once: gone from Redis, and announced to every Ingress on the route channel."""

        async def read() -> tuple[Any, dict[Any, Any]]:
            digest = await self._redis.hget(env_tokens_key(env_id), token_id)
            fields = await self._redis.hgetall(token_key(_text(digest))) if digest is not None else {}
            return digest, fields

        digest, fields = await self._store._call("find endpoint token", read, writes=False)
        if digest is None:
            raise NotFoundError(f"environment {env_id} has no endpoint token {token_id} (revoked already?)")
        message = json.dumps({REVOKED_FIELD: token_id, "environment": env_id}, separators=(",", ":"))
        status, _ = await self._store._script(
            "revoke endpoint token",
            self._revoke,
            [env_tokens_key(env_id), token_key(_text(digest))],
            [token_id, _text(digest), message],
        )
        if status == -1:
            raise NotFoundError(f"environment {env_id} has no endpoint token {token_id} (revoked meanwhile)")
        if fields:
            return _info({_text(k): _text(v) for k, v in fields.items()})
        # Expired and reclaimed by Redis: what the index still said.
        return EndpointTokenInfo(id=token_id, environment_id=env_id, created_at=0.0)

    async def check(self, token: str) -> TokenGrant:
        """What ``token`` reaches; NotFoundError when it is unknown, revoked or expired."""
        if not token.startswith(ENDPOINT_TOKEN_PREFIX):
            raise NotFoundError("not an endpoint token")
        raw = await self._store._call(
            "check endpoint token", lambda: self._redis.hgetall(token_key(hash_api_key(token))), writes=False
        )
        if not raw:
            raise NotFoundError("unknown or revoked endpoint token")
        fields = {_text(k): _text(v) for k, v in raw.items()}
        info = _info(fields)
        if info.expires_at is not None and info.expires_at <= time.time():
            expired = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.expires_at))
            raise NotFoundError(f"endpoint token {info.id} expired at {expired}")
        return TokenGrant(
            token_id=info.id,
            tenant=fields["tenant"],
            environment_id=info.environment_id,
            port=info.port,
            expires_at=info.expires_at,
        )

    async def sweep(self) -> int:
        """Reclaim the tokens of every deleted (or vanished) Environment; how many were reclaimed."""

        async def indexes() -> list[str]:
            return [_text(key) async for key in self._redis.scan_iter(match=ENV_TOKENS_PATTERN, count=500)]

        reclaimed = 0
        for index in await self._store._call("scan endpoint tokens", indexes, writes=False):
            env_id = index.removeprefix(ENV_TOKENS_PATTERN[:-1])
            state = await self._store._call(
                "environment state", partial(self._redis.hget, env_key(env_id), "state"), writes=False
            )
            if state is None or _text(state) == "deleted":
                reclaimed += await self.forget_environment(env_id)
        return reclaimed

    async def forget_environment(self, env_id: str) -> int:
        """Revoke every token of a deleted Environment (refused if it is not deleted); how many there were."""
        tokens = await self._store._call(
            "environment tokens", lambda: self._redis.hgetall(env_tokens_key(env_id)), writes=False
        )
        ids = [_text(token_id) for token_id in tokens]
        messages: list[ScriptArg] = [
            json.dumps({REVOKED_FIELD: i, "environment": env_id}, separators=(",", ":")) for i in ids
        ]
        status, _ = await self._store._script(
            "forget endpoint tokens",
            self._forget,
            [env_key(env_id), env_tokens_key(env_id), *(token_key(_text(tokens[k])) for k in tokens)],
            messages,
        )
        return len(ids) if status == 1 else 0
