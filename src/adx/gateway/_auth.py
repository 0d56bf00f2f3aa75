"""Tenant authentication: ``Authorization: Bearer <API key>`` checked by the Coordinator, answers cached briefly."""

from __future__ import annotations

import hashlib
import time

from adx.errors import ForbiddenError, NotFoundError
from adx.gateway._coordinator import CoordinatorClient
from adx.gateway._errors import Unauthenticated
from adx.model import ENDPOINT_TOKEN_PREFIX

MAX_KEY_LENGTH = 512
MAX_CACHED = 10_000


class TenantAuth:
    """key -> tenant, reused for ``ttl`` seconds so a data-plane request costs no Coordinator round trip.

    The cache is keyed by a digest, so raw keys are not kept in memory longer than a request; a revoked key
    stays usable for at most ``ttl`` seconds on this process.
    """

    def __init__(self, coordinator: CoordinatorClient, ttl: float) -> None:
        self._coordinator = coordinator
        self._ttl = ttl
        self._cache: dict[bytes, tuple[str, float]] = {}

    def forget_all(self) -> None:
        """Drop every cached answer: an admin revoked a key or disabled a tenant through this process, which
        then refuses it at once (other replicas within ``ttl``)."""
        self._cache.clear()

    async def tenant(self, authorization: str | None) -> str:
        if not authorization:
            raise Unauthenticated("missing 'Authorization: Bearer <API key>'")
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthenticated("expected 'Authorization: Bearer <API key>'")
        if len(key) > MAX_KEY_LENGTH:
            raise Unauthenticated("unknown API key")
        if key.startswith(ENDPOINT_TOKEN_PREFIX):
            # SEC-4: said plainly, not "unknown API key": the credential is real, the route is not its own.
            raise ForbiddenError(
                "Authorization",
                "an endpoint token reaches only its Environment's data plane (commands, files, ports); "
                "this route needs the tenant's API key",
            )
        digest = hashlib.sha256(key.encode()).digest()
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        try:
            tenant = await self._coordinator.authenticate(key)
        except NotFoundError:
            raise Unauthenticated("unknown API key") from None
        if self._ttl > 0:
            if len(self._cache) >= MAX_CACHED:
                # Bounded memory: drop everything expired, and if that is not enough, start over.
                self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
                if len(self._cache) >= MAX_CACHED:
                    self._cache.clear()
            self._cache[digest] = (tenant, now + self._ttl)
        return tenant
