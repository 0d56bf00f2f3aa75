"""Worker liveness: a dead worker's runs are reclaimed at once instead of after their lease expires.

A worker holds a session advisory lock on a dedicated connection and refreshes its heartbeat row through it.
When the worker process dies, PostgreSQL ends its session and frees the lock; once the heartbeat is also older
than the grace, the worker's runs are claimable (``OWNER_DEAD`` in :mod:`adx.agents._store`), by a higher
fence as always. Two conditions, because each alone is wrong: a slow but live worker keeps its lock (no
false takeover under load), and a live worker whose session broke stops its in-flight work as soon as a
heartbeat fails, which happens before its grace is over.

A worker that lost its liveness session stops claiming, signals every run it drives as lost, reconnects,
takes its lock again, and only then expires the leases it still holds (its drivers have exited), so those runs
do not wait out a full lease either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg
from psycopg.rows import DictRow, dict_row

from adx.agents._rows import LIVENESS_LOCK_CLASS
from adx.agents._store import AgentStore
from adx.errors import ConflictError, InvalidInputError, UnavailableError

__all__ = ["WorkerLiveness"]

log = logging.getLogger("adx.agents.liveness")


class WorkerLiveness:
    """Registers one worker identity, heartbeats it, and tells its drivers when it may have been declared dead."""

    def __init__(
        self,
        store: AgentStore,
        identity: str,
        tenant_id: str,
        *,
        grace_seconds: float = 1.0,
        heartbeat_seconds: float | None = None,
        drain_seconds: float = 10.0,
    ) -> None:
        if not grace_seconds > 0:
            raise InvalidInputError("liveness_grace_seconds", "must be positive")
        self.store = store
        self.identity = identity
        self.tenant_id = tenant_id
        self.grace_seconds = grace_seconds
        # Several heartbeats per grace: one late heartbeat is not a death.
        self.heartbeat_seconds = heartbeat_seconds or grace_seconds / 4
        if not 0 < self.heartbeat_seconds < grace_seconds:
            raise InvalidInputError("heartbeat_seconds", "must be positive and shorter than the grace")
        self.drain_seconds = drain_seconds
        self._conn: psycopg.AsyncConnection[DictRow] | None = None
        self._watched: set[asyncio.Event] = set()
        self._idle = asyncio.Event()  # set while no driver watches
        self._idle.set()
        self._healthy = False
        self._task: asyncio.Task[None] | None = None
        self.losses = 0

    @property
    def healthy(self) -> bool:
        return self._healthy

    def watch(self, lost: asyncio.Event) -> Callable[[], None]:
        """Set ``lost`` if liveness is (or becomes) lost while the returned unwatch was not called."""
        if not self._healthy:
            lost.set()
        self._watched.add(lost)
        self._idle.clear()

        def unwatch() -> None:
            self._watched.discard(lost)
            if not self._watched:
                self._idle.set()

        return unwatch

    async def start(self) -> None:
        await self._establish()
        self._healthy = True
        self._task = asyncio.create_task(self._loop(), name="agent-worker-liveness")

    async def _establish(self) -> None:
        """Connect, take the identity's lock, (re)register the heartbeat row."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.store.dsn, autocommit=True, row_factory=dict_row, **self.store.connect_options
            )
        except psycopg.Error as exc:
            raise UnavailableError(f"worker liveness: cannot connect: {exc}") from None
        try:
            cur = await conn.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s)) AS locked", (LIVENESS_LOCK_CLASS, self.identity)
            )
            row = await cur.fetchone()
            if not row or not row["locked"]:
                raise ConflictError(f"worker liveness lock of {self.identity!r} is held by another session")
            # Rows of workers long gone (their leases expired ages ago) are pruned by whoever starts next.
            await conn.execute("DELETE FROM adx_agent_workers WHERE heartbeat_at < now() - interval '1 day'")
            await conn.execute(
                "INSERT INTO adx_agent_workers (identity, tenant_id, lock_key, grace_ms) VALUES (%s, %s,"
                " hashtext(%s), %s) ON CONFLICT (identity) DO UPDATE SET heartbeat_at = now()",
                (self.identity, self.tenant_id, self.identity, max(1, int(self.grace_seconds * 1000))),
            )
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def _beat(self) -> None:
        assert self._conn is not None
        await self._conn.execute(
            "UPDATE adx_agent_workers SET heartbeat_at = now() WHERE identity = %s", (self.identity,)
        )

    def _lose(self, reason: str) -> None:
        self._healthy = False
        self.losses += 1
        log.warning("worker liveness lost; stopping in-flight runs", extra={"reason": reason})
        for event in list(self._watched):
            event.set()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                await asyncio.wait_for(self._beat(), timeout=self.grace_seconds)
                continue
            except (psycopg.Error, TimeoutError, OSError) as exc:
                self._lose(f"{type(exc).__name__}: {exc}")
            await self._drop()
            await self._recover()

    async def _recover(self) -> None:
        delay = self.heartbeat_seconds
        while True:
            try:
                await self._establish()
                break
            except (UnavailableError, ConflictError, psycopg.Error, OSError) as exc:
                log.warning("worker liveness: re-registration failed", extra={"error": str(exc)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        # Our drivers saw the loss; once they exited, nothing of ours runs under our old leases: expire them
        # so any worker (us included) continues those runs now, with a higher fence.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=self.drain_seconds)
        if self._idle.is_set() and self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.execute(
                    "UPDATE adx_agent_runs SET lease_expires_at = now() WHERE lease_owner = %s"
                    " AND lease_expires_at > now()",
                    (self.identity,),
                )
        self._healthy = True

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def close(self) -> None:
        """A clean stop: declare ourselves dead at once and end the session (which frees the lock), so runs
        whose ticks the drain aborted continue now, not after their lease. (The row stays: OWNER_DEAD needs it;
        the next worker start prunes rows a day old.)"""
        self._healthy = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await self._conn.execute(
                    "UPDATE adx_agent_workers SET heartbeat_at = now() - interval '1 hour' WHERE identity = %s",
                    (self.identity,),
                )
        await self._drop()
