"""The Python submission and operations API: admit runs; read, list, wait for, cancel, resolve and retry them.

Submission never starts a worker (AGT-13): it only writes the admitted run; workers pick it up.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from datetime import datetime
from typing import Any

from adx.agents._admission import build_admission
from adx.agents._canonical import JsonObject, json_clone
from adx.agents._children import list_children
from adx.agents._graph import ExecutableGraphRegistry
from adx.agents._pg import check_tenant
from adx.agents._rows import ResolveOutcome, RunKey
from adx.agents._status import RunStatus
from adx.agents._store import AgentStore
from adx.agents._views import AgentResult, RunEvent, RunPage, RunView
from adx.errors import ConflictError, InvalidInputError

__all__ = ["AgentRuns"]

_MAX_KEY = 200


def _parse_run_id(run_id: uuid.UUID | str) -> uuid.UUID:
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        raise InvalidInputError("run_id", f"{run_id!r} is not a UUID") from None


def _cursor(view: RunView) -> str:
    return base64.urlsafe_b64encode(f"{view.created_at.isoformat()}|{view.run_id}".encode()).decode()


def _parse_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        at, run_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return datetime.fromisoformat(at), uuid.UUID(run_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidInputError("cursor", "is not a cursor returned by list_runs") from None


class AgentRuns:
    """Admission and operations over one store. ``executables`` (the frozen registry) is needed to submit;
    reading, listing, waiting, cancelling, resolving and retrying work without it."""

    def __init__(self, store: AgentStore, executables: ExecutableGraphRegistry | None = None) -> None:
        self.store = store
        self._executables = executables

    @property
    def executables(self) -> ExecutableGraphRegistry:
        if self._executables is None:
            raise ConflictError("this AgentRuns has no executable registry: pass one to submit runs")
        return self._executables

    async def create_tenant(self, tenant_id: str) -> None:
        await self.store.ensure_tenant(tenant_id)

    async def submit(
        self,
        tenant_id: str,
        graph: str,
        version: str,
        input: Any,
        *,
        budget: JsonObject | None = None,
        idempotency_key: str | None = None,
        run_id: uuid.UUID | None = None,
        deadline_seconds: float | None = None,
    ) -> RunView:
        """Admit a run atomically with its descriptor, request and resolved budget. ``deadline_seconds``: the
        maintenance role (``adx agent maintenance``) cancels the run if it has not finished by then."""
        if deadline_seconds is not None and not 0 < deadline_seconds <= 366 * 86400:
            raise InvalidInputError("deadline_seconds", "must be positive and at most a year")
        check_tenant(tenant_id)
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= _MAX_KEY
        ):
            raise InvalidInputError("idempotency_key", f"must be 1-{_MAX_KEY} characters")
        admission = build_admission(self.executables, graph, version, input, budget)
        new_id, _ = await self.store.admit(
            RunKey(tenant_id, run_id or uuid.uuid4()),
            admission,
            idempotency_key=idempotency_key,
            deadline_s=deadline_seconds,
        )
        return await self.get_run(tenant_id, new_id)

    async def get_run(self, tenant_id: str, run_id: uuid.UUID | str) -> RunView:
        check_tenant(tenant_id)
        return await self.store.read_run(RunKey(tenant_id, _parse_run_id(run_id)))

    async def get_result(self, tenant_id: str, run_id: uuid.UUID | str) -> AgentResult | None:
        """The committed result of a finished run; None while the run is not finished."""
        check_tenant(tenant_id)
        key = RunKey(tenant_id, _parse_run_id(run_id))
        result = await self.store.read_result(key)
        if result is None:
            await self.store.read_run(key)  # NotFoundError for an unknown run
        return result

    async def request_cancellation(self, tenant_id: str, run_id: uuid.UUID | str) -> RunView:
        """Ask for cancellation; a driver confirms it (status ``cancelled``) with database time."""
        check_tenant(tenant_id)
        return await self.store.request_cancellation(RunKey(tenant_id, _parse_run_id(run_id)))

    async def resolve_interrupt(self, tenant_id: str, run_id: uuid.UUID | str, wait_id: str, resolution: Any) -> bool:
        """Resolve an interrupt (see :meth:`resolve`); returns False for an exact duplicate resolution."""
        return await self.resolve(tenant_id, run_id, wait_id, resolution) is not ResolveOutcome.DUPLICATE

    async def resolve(self, tenant_id: str, run_id: uuid.UUID | str, wait_id: str, resolution: Any) -> ResolveOutcome:
        """Resolve interrupt ``wait_id`` of a run.

        ``RESOLVED``: the run waited on it and wakes. ``STORED_EARLY``: the run has not reached that wait yet
        and its graph declares the interrupt; the resolution is stored and consumed by the wait edge that
        registers it. ``DUPLICATE``: an exact repeat of the last resolution of that name. A name the graph does
        not declare raises InvalidInputError (field ``wait_id``); a run whose graph declares no interrupts
        raises NotFoundError unless it waits on that name.
        """
        check_tenant(tenant_id)
        if not isinstance(wait_id, str) or not wait_id:
            raise InvalidInputError("wait_id", "must be a non-empty string")
        try:
            value = json_clone(resolution)
        except ValueError as exc:
            raise InvalidInputError("resolution", str(exc)) from None
        return await self.store.resolve_interrupt(RunKey(tenant_id, _parse_run_id(run_id)), wait_id, value)

    async def list_runs(
        self,
        tenant_id: str,
        *,
        status: RunStatus | str | None = None,
        graph: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """A tenant's runs, newest first, optionally of one status and/or graph; page with ``cursor``."""
        check_tenant(tenant_id)
        if status is not None:
            try:
                status = RunStatus(status)
            except ValueError:
                raise InvalidInputError("status", f"must be one of {[s.value for s in RunStatus]}") from None
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidInputError("limit", "must be between 1 and 1000")
        rows = await self.store.list_runs(
            tenant_id,
            status=status.value if status is not None else None,
            graph=graph,
            before=_parse_cursor(cursor) if cursor else None,
            limit=limit + 1,
        )
        views = tuple(rows[:limit])
        return RunPage(views, _cursor(views[-1]) if len(rows) > limit else None)

    async def children(
        self, tenant_id: str, run_id: uuid.UUID | str, *, limit: int = 100, cursor: str | None = None
    ) -> RunPage:
        """A run's child runs (spawned by its nodes), oldest first; page with ``cursor``."""
        check_tenant(tenant_id)
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidInputError("limit", "must be between 1 and 1000")
        rows = await list_children(
            self.store,
            RunKey(tenant_id, _parse_run_id(run_id)),
            after=_parse_cursor(cursor) if cursor else None,
            limit=limit + 1,
        )
        views = tuple(rows[:limit])
        return RunPage(views, _cursor(views[-1]) if len(rows) > limit else None)

    async def history(self, tenant_id: str, run_id: uuid.UUID | str) -> list[RunEvent]:
        check_tenant(tenant_id)
        return await self.store.read_history(RunKey(tenant_id, _parse_run_id(run_id)))

    async def wait(
        self,
        tenant_id: str,
        run_id: uuid.UUID | str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline on polling, mirrors asyncio.wait_for
        poll_seconds: float = 0.2,
    ) -> AgentResult:
        """Wait until the run finished and return its result; TimeoutError after ``timeout`` seconds."""
        if not poll_seconds > 0:
            raise InvalidInputError("poll_seconds", "must be positive")

        async def poll() -> AgentResult:
            while True:
                result = await self.get_result(tenant_id, run_id)
                if result is not None:
                    return result
                await asyncio.sleep(poll_seconds)

        return await asyncio.wait_for(poll(), timeout=timeout)

    async def retry(self, tenant_id: str, run_id: uuid.UUID | str) -> RunView:
        """Go on with a failed run from the last checkpoint before its failure (a new step: node attempts
        start afresh; usage keeps accumulating). The failure result is kept in the run's history."""
        check_tenant(tenant_id)
        key = RunKey(tenant_id, _parse_run_id(run_id))
        await self.store.retry_run(key)
        return await self.get_run(tenant_id, key.run_id)

    async def fork(self, tenant_id: str, run_id: uuid.UUID | str, checkpoint_seq: int) -> RunView:
        """A new run of the same graph, request and budget, starting from the state at ``checkpoint_seq`` of
        ``run_id`` (one of its last kept checkpoints, ``store.checkpoint_retention``); the source is unchanged."""
        check_tenant(tenant_id)
        if not isinstance(checkpoint_seq, int) or isinstance(checkpoint_seq, bool) or checkpoint_seq < 0:
            raise InvalidInputError("checkpoint_seq", "must be a non-negative integer")
        new_id = uuid.uuid4()
        await self.store.fork_run(RunKey(tenant_id, _parse_run_id(run_id)), checkpoint_seq, new_id)
        return await self.get_run(tenant_id, new_id)
