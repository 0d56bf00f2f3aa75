"""The agent store's PostgreSQL plumbing: the pool, connections and write transactions, and the translation of
psycopg errors into :mod:`adx.errors` families (a connection lost while a write was in flight becomes
:class:`~adx.errors.UncertainOutcomeError`, which callers reconcile by replaying the edge)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeAlias, TypedDict

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from adx.errors import ConflictError, InvalidInputError, UnavailableError, UncertainOutcomeError

__all__ = ["CommitHook", "Conn", "ConnectOptions", "Database", "StoreFaults", "check_tenant", "open_pool", "translate"]

Conn: TypeAlias = AsyncConnection[DictRow]
#: Application code run inside a node-commit transaction (side effects that commit with the checkpoint).
CommitHook: TypeAlias = Callable[[Conn], Awaitable[None]]

_TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class ConnectOptions(TypedDict, total=False):
    """psycopg connect keywords every connection of the store uses (the pool's, and worker liveness's own)."""

    options: str  # server settings: statement and lock timeouts
    connect_timeout: int


@dataclass
class StoreFaults:
    """Fault injection for tests: ``after_commit(edge)`` runs after an edge committed, before the caller sees
    the result; raising there reproduces a lost acknowledgement (the write happened, the reply was lost)."""

    after_commit: Callable[[str], None] | None = None


def check_tenant(tenant_id: str) -> str:
    if not isinstance(tenant_id, str) or not _TENANT.match(tenant_id):
        raise InvalidInputError("tenant_id", "must be 1-63 characters of a-z, 0-9, '_' or '-', starting alphanumeric")
    return tenant_id


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None)


def translate(exc: psycopg.Error, what: str, *, writing: bool) -> Exception:
    """Map a psycopg error to an ADX family. A write whose connection broke has an unknown outcome."""
    state = _sqlstate(exc) or ""
    if isinstance(exc, psycopg.OperationalError) and not state:
        cls = UncertainOutcomeError if writing else UnavailableError
        return cls(f"{what}: database connection failed: {exc}")
    if state.startswith("40"):  # serialization failure, deadlock: nothing committed; retryable
        return UnavailableError(f"{what}: transaction aborted ({state}); retry", details={"sqlstate": state})
    if state == "57014":  # statement timeout / cancel: the transaction rolled back
        return UnavailableError(f"{what}: statement timed out", details={"sqlstate": state})
    if state.startswith("08") or state.startswith("57") or state.startswith("53"):
        cls = UncertainOutcomeError if writing else UnavailableError
        return cls(f"{what}: database unavailable ({state}): {exc}", details={"sqlstate": state})
    if state == "23505":
        return ConflictError(f"{what}: duplicate ({exc.diag.constraint_name})", details={"sqlstate": state})
    return UnavailableError(f"{what}: database error ({state or type(exc).__name__}): {exc}")


async def open_pool(
    dsn: str,
    *,
    min_size: int,
    max_size: int,
    timeout: float,  # noqa: ASYNC109 - bounds pool start-up, not this coroutine alone
    statement_timeout_ms: int,
) -> tuple[AsyncConnectionPool[Conn], ConnectOptions]:
    """An open pool (waiting up to ``timeout`` s for the first connection) and the connect options it uses."""
    if not 1 <= min_size <= max_size:
        raise InvalidInputError("max_size", "need 1 <= min_size <= max_size")
    options: ConnectOptions = {
        # Bounded statements and lock waits: a stuck database surfaces as an error, not a hang.
        "options": f"-c statement_timeout={statement_timeout_ms} -c lock_timeout={statement_timeout_ms}",
        "connect_timeout": max(1, int(timeout)),
    }
    pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        open=False,
        timeout=timeout,
        connection_class=AsyncConnection[DictRow],
        kwargs={"autocommit": True, "row_factory": dict_row, **options},
    )
    try:
        await pool.open(wait=True, timeout=timeout)
    except PoolTimeout as exc:
        await pool.close()
        raise UnavailableError(f"cannot connect to PostgreSQL within {timeout}s: {exc}") from None
    return pool, options


@dataclass
class Database:
    """A pool with bounded waits, whose connections and transactions raise :mod:`adx.errors` families."""

    pool: AsyncConnectionPool[Conn]
    faults: StoreFaults = field(default_factory=StoreFaults)
    timeout: float = 30.0
    #: How the pool connects; worker liveness opens its own session with the same settings.
    dsn: str = ""
    connect_options: ConnectOptions = field(default_factory=lambda: ConnectOptions())

    async def close(self) -> None:
        await self.pool.close()

    @contextlib.asynccontextmanager
    async def connection(self, what: str, *, writing: bool = False) -> AsyncIterator[Conn]:
        try:
            async with self.pool.connection(timeout=self.timeout) as conn:
                yield conn
        except PoolTimeout:
            raise UnavailableError(f"{what}: no database connection within {self.timeout}s") from None
        except psycopg.Error as exc:
            raise translate(exc, what, writing=writing) from exc

    @contextlib.asynccontextmanager
    async def transaction(self, what: str, *, single_statement: bool = False) -> AsyncIterator[Conn]:
        """One write transaction; a lost connection surfaces as UncertainOutcomeError (reconcile, then retry).

        ``single_statement``: the body runs exactly one statement, which PostgreSQL executes atomically as its
        own transaction; skipping BEGIN/COMMIT saves two round trips on the hot path without weakening it.
        """
        async with self.connection(what, writing=True) as conn:
            if single_statement:
                yield conn
            else:
                async with conn.transaction():
                    yield conn
        if self.faults.after_commit is not None:
            self.faults.after_commit(what)
