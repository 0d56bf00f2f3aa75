"""One Redis client factory for the Coordinator: a plain ``redis://`` / ``rediss://`` / ``unix://`` URL, or a
Sentinel URL that follows the primary across failovers.

Sentinel URL form (documented in docs/high-availability.md)::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]

The sentinels are asked where ``service_name``'s primary is; the user/password (if any) authenticate to the
Redis servers, not to the sentinels. After a failover the next connection goes to the promoted replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from adx.errors import InvalidInputError

SENTINEL_SCHEME = "redis+sentinel://"


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelUrl:
    """``redis+sentinel://[[user]:password@]h:p[,h:p...]/service[/db]``; InvalidInputError names redis_url."""
    if not url.startswith(SENTINEL_SCHEME):
        raise InvalidInputError("redis_url", f"not a Sentinel URL (must start with {SENTINEL_SCHEME})")
    rest = url[len(SENTINEL_SCHEME) :]
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        auth, _, netloc = netloc.rpartition("@")
        user, sep, secret = auth.partition(":")
        username, password = (unquote(user) or None, unquote(secret)) if sep else (None, unquote(user))
    sentinels = []
    for item in netloc.split(","):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidInputError("redis_url", f"sentinel address {item!r} is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise InvalidInputError("redis_url", "a Sentinel URL needs /service_name[/db] after the sentinel addresses")
    if len(parts) == 2 and not parts[1].isdigit():
        raise InvalidInputError("redis_url", f"database {parts[1]!r} is not a number")
    return SentinelUrl(tuple(sentinels), unquote(parts[0]), int(parts[1]) if len(parts) == 2 else 0, username, password)


class _ClientOptions(TypedDict):
    """What every connection of a client gets, direct or through Sentinel."""

    socket_timeout: float
    socket_connect_timeout: float
    retry: Retry
    client_name: str | None


def redis_client(url: str, *, timeout: float, client_name: str | None = None) -> aioredis.Redis:
    """A client for ``url`` with no silent retries (a re-sent CAS script could turn our own success into a
    "stale revision"; failures surface to the caller instead) and ``timeout`` on connect and on each reply."""
    common = _ClientOptions(
        socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0), client_name=client_name
    )
    if not url.startswith(SENTINEL_SCHEME):
        return aioredis.Redis.from_url(url, **common)
    parsed = parse_sentinel_url(url)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(parsed.sentinels),
        sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout},
        **common,
    )
    client: aioredis.Redis = sentinel.master_for(
        parsed.service, db=parsed.db, username=parsed.username, password=parsed.password
    )
    return client
