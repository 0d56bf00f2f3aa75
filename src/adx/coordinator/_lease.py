"""The Coordinator's leader lease: exactly one replica is active, fenced by a token held in Redis.

The lease is one Redis key whose value is ``"<token>:<replica id>"`` with a TTL kept by Redis (so no replica's
clock matters). The token comes from ``INCR`` on a counter in the same script that takes the lease, so every
term has a larger token than the one before; the replica id (random per process) makes the value unique even
if a Redis failover lost the last ``INCR`` and a token number were handed out twice. Every write of the store
checks this value inside its own script (``_scripts.FENCE``): a replica that lost the lease — frozen by
SIGSTOP past the TTL, cut off from Redis — can never write again, whatever it believes.

The active replica renews every third of the TTL and considers itself active only until ``sent + ttl`` of the
last successful renewal (measured from before the request was sent, so a slow reply only shortens it).

A standby takes the lease when it expires, or sooner when the holder is evidently dead: every replica's lease
connection carries the Redis client name ``adx-coordinator:<replica id>``, and a SIGKILLed process's
connections close with it. When no connection of the holder has been seen for longer than one renewal
interval (plus a margin — a live holder reconnects at its next renewal after a network blip), the standby
replaces exactly that holder's value by compare-and-set. If ``CLIENT LIST`` is not permitted (ACLs), the
standby simply waits for the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from adx.coordinator._redis import redis_client

log = logging.getLogger("adx.coordinator.lease")

LEASE_KEY = "adx:coordinator:lease"
TOKEN_KEY = "adx:coordinator:lease-token"
CLIENT_NAME_PREFIX = "adx-coordinator:"

# KEYS: lease, token counter   ARGV: replica id, ttl ms, replaced ('' = only a free lease; else the exact value
#                                    of a holder seen dead, taken over only if it is still that value)
ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[3] then return {0, cur} end
local value = redis.call('INCR', KEYS[2]) .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', tonumber(ARGV[2]))
return {1, value}
"""

# KEYS: lease   ARGV: value, ttl ms
RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""

# KEYS: lease   ARGV: value
RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

_REDIS_FAILURES = (redis_errors.RedisError, OSError, TimeoutError)


def token_of(value: str) -> int:
    return int(value.partition(":")[0])


class LeaderLease:
    """One replica's view of the lease. ``campaign()`` until held, then ``keep()`` until lost."""

    def __init__(self, url: str, *, ttl: float, redis_timeout: float, replica_id: str | None = None) -> None:
        self.ttl = ttl
        self.renew_interval = ttl / 3
        self.replica_id = replica_id or uuid.uuid4().hex[:16]
        # A renewal that cannot finish within a renewal interval is as good as lost: bound every reply by it.
        self._redis: aioredis.Redis = redis_client(
            url, timeout=min(redis_timeout, self.renew_interval), client_name=CLIENT_NAME_PREFIX + self.replica_id
        )
        self._acquire = self._redis.register_script(ACQUIRE)
        self._renew = self._redis.register_script(RENEW)
        self._release = self._redis.register_script(RELEASE)
        self.value: str | None = None  # "<token>:<replica id>" while this replica holds (or held) the lease
        self._valid_until = 0.0  # monotonic
        self.lost = asyncio.Event()

    @property
    def token(self) -> int:
        assert self.value is not None
        return token_of(self.value)

    def held(self) -> bool:
        """True while the last renewal vouches for the lease (the store's fencing decides in Redis anyway)."""
        return self.value is not None and not self.lost.is_set() and time.monotonic() < self._valid_until

    def mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            log.warning("leader lease lost: %s", why, extra={"token": self.value, "replica": self.replica_id})
            self.lost.set()

    async def close(self) -> None:
        await self._redis.aclose()

    async def _disconnect(self) -> None:
        with contextlib.suppress(*_REDIS_FAILURES):
            await self._redis.connection_pool.disconnect(inuse_connections=False)

    async def try_acquire(self, replaced: str = "") -> str | None:
        """Take the lease if free (or still ``replaced``); returns the current holder's value when refused."""
        sent = time.monotonic()
        status, detail = await self._acquire(
            keys=[LEASE_KEY, TOKEN_KEY], args=[self.replica_id, self._ttl_ms, replaced]
        )
        detail = detail.decode() if isinstance(detail, bytes) else str(detail)
        if status == 1:
            self.value, self._valid_until = detail, sent + self.ttl
            self.lost.clear()
            log.info("leader lease acquired", extra={"token": detail, "replica": self.replica_id})
            return None
        return detail

    @property
    def _ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))

    async def _holder_connected(self, holder: str) -> bool | None:
        """Whether the holder has a connection to Redis now; None when CLIENT LIST cannot tell."""
        name = CLIENT_NAME_PREFIX + holder.partition(":")[2]
        try:
            clients = await self._redis.client_list()
        except redis_errors.ResponseError:  # e.g. NOPERM under ACLs: fall back to the TTL alone
            return None
        return any(c.get("name") == name for c in clients)

    async def campaign(self, stop: asyncio.Event, *, poll: float = 0.2) -> bool:
        """Stand by until this replica holds the lease (True) or ``stop`` is set (False)."""
        seen_holder, absent_since = "", 0.0
        grace = self.renew_interval + 0.5
        fast_takeover = True
        while not stop.is_set():
            try:
                holder = await self.try_acquire()
                if holder is None:
                    return True
                if holder != seen_holder:
                    seen_holder, absent_since = holder, 0.0
                    log.info("standing by", extra={"holder": holder, "replica": self.replica_id})
                if fast_takeover:
                    connected = await self._holder_connected(holder)
                    fast_takeover = connected is not None
                    now = time.monotonic()
                    if connected:
                        absent_since = 0.0
                    elif connected is False and not absent_since:
                        absent_since = now
                    elif connected is False and now - absent_since > grace:
                        log.warning("lease holder has no Redis connection: taking over", extra={"holder": holder})
                        if await self.try_acquire(replaced=holder) is None:
                            return True
            except _REDIS_FAILURES as exc:
                log.warning("standby: Redis unavailable: %s", exc, extra={"replica": self.replica_id})
                await self._disconnect()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll)
        return False

    async def keep(self) -> None:
        """Renew every third of the TTL; returns once the lease is lost: Redis refused the renewal (another
        replica holds it, or it expired there), or no renewal succeeded within the TTL."""
        assert self.value is not None
        while not self.lost.is_set():
            sent = time.monotonic()
            try:
                # Even after a stall past the TTL (event loop blocked, SIGSTOP) ask Redis: only the value still
                # being there proves that nobody took over meanwhile; held() refuses calls until then.
                renewed = await asyncio.wait_for(
                    self._renew(keys=[LEASE_KEY], args=[self.value, self._ttl_ms]),
                    max(self._valid_until - sent, self.renew_interval),
                )
            except _REDIS_FAILURES as exc:
                if time.monotonic() >= self._valid_until:
                    self.mark_lost(f"not renewed within the lease TTL ({exc})")
                    return
                # Keep trying while the lease is still ours: a Redis failover may end within the TTL.
                log.warning("lease renewal failed: %s", exc, extra={"token": self.value})
                await self._disconnect()
                await asyncio.sleep(min(0.2, max(self._valid_until - time.monotonic(), 0)))
                continue
            if renewed != 1:
                self.mark_lost("Redis no longer holds this replica's lease (taken over or expired)")
                return
            self._valid_until = sent + self.ttl
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.lost.wait(), self.renew_interval)

    async def release(self) -> None:
        """Give the lease up at a clean stop, so a standby need not wait for the TTL."""
        if self.value is None:
            return
        value, self.value = self.value, None
        self.lost.set()
        with contextlib.suppress(*_REDIS_FAILURES):
            await asyncio.wait_for(self._release(keys=[LEASE_KEY], args=[value]), self.renew_interval)
            log.info("leader lease released", extra={"token": value})
