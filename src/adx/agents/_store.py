"""The agent runtime's PostgreSQL store: one object over one pool, whose transactions are grouped by concern.

Each public coroutine that changes a run is exactly one SQL transaction, one lifecycle edge each. Worker writes
are fenced: they name the fence and lease owner they hold, and change nothing when either moved on. The pool and
error translation are :mod:`adx.agents._pg`, the schema :mod:`adx.agents._migrations`, the records handed out
:mod:`adx.agents._rows`; the queries: run-level transactions :mod:`adx.agents._store_runs`, claims to node
commits :mod:`adx.agents._store_steps`, lifecycle edges and evidence :mod:`adx.agents._store_edges`.
"""

from __future__ import annotations

from dataclasses import dataclass

from adx.agents._migrations import check_schema, migrate
from adx.agents._pg import open_pool
from adx.agents._store_edges import EdgeQueries
from adx.agents._store_runs import RunQueries
from adx.agents._store_steps import StepQueries

__all__ = ["AgentStore"]


@dataclass
class AgentStore(RunQueries, StepQueries, EdgeQueries):
    """The runtime's PostgreSQL store. Open with :meth:`open`; close with :meth:`close`."""

    checkpoint_retention: int = 16

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        migrate: bool = True,
        timeout: float = 30.0,  # noqa: ASYNC109 - bounds pool start-up, not this coroutine alone
        statement_timeout_ms: int = 30_000,
    ) -> AgentStore:
        """Open a pool (waiting up to ``timeout`` s for the first connection); apply migrations unless told not."""
        pool, options = await open_pool(
            dsn, min_size=min_size, max_size=max_size, timeout=timeout, statement_timeout_ms=statement_timeout_ms
        )
        store = cls(pool, timeout=timeout, dsn=dsn, connect_options=options)
        try:
            if migrate:
                await store.migrate()
            await store.check_schema()
        except BaseException:
            await pool.close()
            raise
        return store

    async def migrate(self) -> list[int]:
        """Apply missing migrations (:func:`adx.agents._migrations.migrate`). Returns applied versions."""
        return await migrate(self)

    async def check_schema(self) -> None:
        """Verify the real schema holds exactly this build's migrations (:mod:`adx.agents._migrations`)."""
        await check_schema(self)
