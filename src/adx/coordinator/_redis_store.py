"""How the Coordinator's stores use Redis: fenced scripts, replica acknowledgement and error translation.

Every change that touches more than one key, or must not overwrite a newer version, is one Lua script
(``_scripts``). Redis errors are translated here: a connection failure before a command was sent is
UnavailableError; a failure after it may have been applied is UncertainOutcomeError, and callers must
reload the authoritative record before acting (CRD-2).

High availability: the daemon's store is fenced (``fence_with``): every script carries the leader lease's
value and refuses to write when the lease is no longer this replica's (NotLeader). With ``wait_replicas``,
each write also waits (``WAIT``) for that many replicas to have it before it is acknowledged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from adx.coordinator import _scripts
from adx.coordinator._lease import LEASE_KEY
from adx.errors import AdxError, UnavailableError, UncertainOutcomeError

T = TypeVar("T")

ScriptArg = str | int | float


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _never_connected(exc: redis_errors.ConnectionError) -> bool:
    # redis-py words connect failures as "Error <errno> connecting to host:port."
    return isinstance(exc.__cause__, ConnectionRefusedError) or " connecting to " in str(exc)


class NotLeader(UnavailableError):
    """This replica no longer holds the leader lease: Redis refused the write (fencing), nothing changed."""

    code = "not_leader"


class RedisStore:
    """A Redis client with the Coordinator's write discipline; the stores of each kind of state build on it."""

    def __init__(self, client: aioredis.Redis, *, wait_replicas: int = 0, wait_timeout: float = 1.0) -> None:
        self._redis = client
        self._fence = ""  # the leader lease value every script must find in Redis ('' = unfenced)
        self._on_fenced: Callable[[str], None] | None = None
        self._wait_replicas = wait_replicas
        self._wait_timeout_ms = max(1, round(wait_timeout * 1000))

    def fence_with(self, lease_value: str, on_fenced: Callable[[str], None]) -> None:
        """From now on every write requires the leader lease to hold ``lease_value``; ``on_fenced(holder)``
        is told when Redis refused one (the caller stops serving)."""
        self._fence = lease_value
        self._on_fenced = on_fenced

    async def _script(self, what: str, script: Any, keys: list[str], args: list[ScriptArg]) -> tuple[int, Any]:
        """Run a fenced write script; raises NotLeader when this replica's lease is gone (nothing written)."""
        keys = [*keys, LEASE_KEY]
        args = [*args, self._fence]

        async def op() -> Any:
            if not self._wait_replicas:
                return await script(keys=keys, args=args)
            # WAIT must follow the write on the same connection: one pipeline (not a transaction).
            async with self._redis.pipeline(transaction=False) as pipe:
                await script(keys=keys, args=args, client=pipe)
                pipe.execute_command("WAIT", self._wait_replicas, self._wait_timeout_ms)
                result, acks = await pipe.execute()
            if int(result[0]) == 1 and int(acks) < self._wait_replicas:
                raise UncertainOutcomeError(
                    f"{what}: written on the Redis primary but confirmed by {acks} of {self._wait_replicas} "
                    "replicas in time (redis_wait_replicas); a failover now could lose it"
                )
            return result

        status, detail = await self._call(what, op, writes=True)
        if int(status) == _scripts.FENCED:
            holder = _text(detail)
            if self._on_fenced is not None:
                self._on_fenced(holder)
            raise NotLeader(f"{what}: refused: this Coordinator replica lost the leader lease (standby)")
        return int(status), detail

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, what: str, op: Callable[[], Awaitable[T]], *, writes: bool) -> T:
        try:
            return await op()
        except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
            # The server went away or stalled: its other pooled connections are as suspect as this one.
            await self._redis.connection_pool.disconnect(inuse_connections=False)
            raise self._translate(what, exc, writes) from exc
        except redis_errors.RedisError as exc:
            raise UnavailableError(f"{what}: Redis error: {exc}") from exc

    @staticmethod
    def _translate(what: str, exc: redis_errors.RedisError, writes: bool) -> AdxError:
        if isinstance(exc, redis_errors.ConnectionError):
            # A connection that could not be made never carried the command; a lost one may have.
            if writes and not _never_connected(exc):
                return UncertainOutcomeError(f"{what}: connection lost after sending; outcome unknown")
            return UnavailableError(f"{what}: Redis unavailable: {exc}")
        if writes:
            return UncertainOutcomeError(f"{what}: Redis timed out; outcome unknown")
        return UnavailableError(f"{what}: Redis timed out")

    async def ping(self) -> None:
        await self._call("ping", self._redis.ping, writes=False)
