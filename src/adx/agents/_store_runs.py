"""The agent store's run-level transactions: tenants, admission, the public reads (one run, its result, a page
of runs, its history), cancellation requests, interrupt resolution, and the operator's retry and fork.

Each public coroutine that changes a run is exactly one SQL transaction (see :mod:`adx.agents._store`)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from adx.agents._admission import Admission
from adx.agents._pg import Conn, Database, check_tenant
from adx.agents._rows import (
    RUN_COLUMNS,
    TERMINAL,
    ParentClaim,
    ResolveOutcome,
    RunKey,
    fenced_row,
    fetch_checkpoint,
    fetch_one,
    fetch_run,
)
from adx.agents._status import CheckpointKind, RunStatus
from adx.agents._views import AgentResult, RunEvent, RunView, agent_result, run_event, run_view
from adx.errors import ConflictError, InvalidInputError, NotFoundError

__all__ = ["RunQueries"]


class RunQueries(Database):
    """Run-level transactions of :class:`~adx.agents._store.AgentStore` (a mixin over its pool)."""

    # --- tenants and admission ---------------------------------------------------------------------------

    async def ensure_tenant(self, tenant_id: str) -> None:
        check_tenant(tenant_id)
        async with self.transaction("ensure tenant") as conn:
            await conn.execute(
                "INSERT INTO adx_agent_tenants (tenant_id) VALUES (%s) ON CONFLICT DO NOTHING", (tenant_id,)
            )

    async def admit(
        self,
        key: RunKey,
        admission: Admission,
        *,
        idempotency_key: str | None,
        deadline_s: float | None = None,
        parent: ParentClaim | None = None,
    ) -> tuple[uuid.UUID, bool]:
        """Admit a run atomically (row, usage, initial checkpoint). Returns (run_id, created).

        ``deadline_s``: the maintenance role cancels the run once it is not finished this long after admission
        (database time). ``parent``: a child run spawned by a node of that run; the parent's fence and owner are
        checked (a stale worker spawns nothing) and its child count goes up in the same transaction."""
        async with self.transaction("admit run") as conn:
            cur = await conn.execute("SELECT 1 FROM adx_agent_tenants WHERE tenant_id = %s", (key.tenant_id,))
            if await cur.fetchone() is None:
                raise NotFoundError(f"tenant {key.tenant_id!r} does not exist")
            cur = await conn.execute(
                "INSERT INTO adx_agent_runs (tenant_id, run_id, graph_name, graph_version, status, descriptor,"
                " request, budget, idempotency_key, deadline_at, parent_run_id) VALUES (%s, %s, %s, %s, 'queued',"
                " %s, %s, %s, %s, now() + make_interval(secs => %s::double precision), %s)"
                " ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING run_id",
                (
                    key.tenant_id,
                    key.run_id,
                    admission.graph_name,
                    admission.graph_version,
                    Jsonb(admission.descriptor),
                    Jsonb(admission.request),
                    Jsonb(admission.budget),
                    idempotency_key,
                    deadline_s,
                    parent.run_id if parent is not None else None,
                ),
            )
            created = await cur.fetchone() is not None
            if parent is not None:
                cur = await conn.execute(
                    "UPDATE adx_agent_runs SET children = children + %s WHERE tenant_id = %s AND run_id = %s"
                    " AND fence = %s AND lease_owner = %s RETURNING 1",
                    (1 if created else 0, key.tenant_id, parent.run_id, parent.fence, parent.owner),
                )
                await fenced_row(cur, parent.run_id, parent.fence)
            if not created:
                # Duplicate submission: the same idempotency key returns the first run if it asked the same.
                cur = await conn.execute(
                    "SELECT run_id, request, descriptor FROM adx_agent_runs"
                    " WHERE tenant_id = %s AND idempotency_key = %s",
                    (key.tenant_id, idempotency_key),
                )
                row = await cur.fetchone()
                assert row is not None
                if row["request"] != admission.request or row["descriptor"] != admission.descriptor:
                    raise ConflictError("idempotency_key was already used for a different request")
                return row["run_id"], False
            await conn.execute(
                "INSERT INTO adx_agent_usage (tenant_id, run_id) VALUES (%s, %s)", (key.tenant_id, key.run_id)
            )
            await conn.execute(
                "INSERT INTO adx_agent_checkpoints (tenant_id, run_id, seq, kind, next_node, state, fence)"
                " VALUES (%s, %s, 0, 'initial', %s, %s, 0)",
                (key.tenant_id, key.run_id, admission.entry, Jsonb(admission.initial_state)),
            )
        return key.run_id, True

    # --- public reads and requests -----------------------------------------------------------------------

    async def read_run(self, key: RunKey) -> RunView:
        async with self.connection("get run") as conn:
            row = await fetch_one(
                conn,
                f"SELECT {RUN_COLUMNS} FROM adx_agent_runs r JOIN adx_agent_usage u USING (tenant_id, run_id)"
                " WHERE r.tenant_id = %s AND r.run_id = %s",
                (key.tenant_id, key.run_id),
                f"run {key.run_id} does not exist",
            )
            cur = await conn.execute(
                "SELECT wait_id, kind, payload, registered_at, due_at, resolved_at FROM adx_agent_waits"
                " WHERE tenant_id = %s AND run_id = %s AND wait_set = %s ORDER BY wait_id",
                (key.tenant_id, key.run_id, row["checkpoint_seq"]),
            )
            waits = await cur.fetchall() if row["status"] == "waiting" else []
            return run_view(row, waits)

    async def read_result(self, key: RunKey) -> AgentResult | None:
        async with self.connection("get result") as conn:
            cur = await conn.execute(
                "SELECT status, result, usage, event_id, revision, created_at FROM adx_agent_results"
                " WHERE tenant_id = %s AND run_id = %s",
                (key.tenant_id, key.run_id),
            )
            row = await cur.fetchone()
        return None if row is None else agent_result(key.run_id, row)

    async def request_cancellation(self, key: RunKey) -> RunView:
        """Record the request (idempotent). A waiting run becomes claimable so a driver confirms it."""
        async with self.transaction("request cancellation") as conn:
            cur = await conn.execute(
                "UPDATE adx_agent_runs SET cancel_requested_at = now(), revision = revision + 1, updated_at = now(),"
                # A waiting or backed-off run becomes claimable now, so a driver confirms promptly.
                " wake_at = CASE WHEN status = 'waiting' THEN now() ELSE wake_at END,"
                " available_at = LEAST(available_at, now())"
                " WHERE tenant_id = %s AND run_id = %s AND cancel_requested_at IS NULL"
                " AND status NOT IN ('succeeded', 'failed', 'cancelled') RETURNING status",
                (key.tenant_id, key.run_id),
            )
            if await cur.fetchone() is None:
                row = await fetch_run(conn, key, "status, cancel_requested_at")
                if row["cancel_requested_at"] is None and row["status"] != "cancelled":
                    raise ConflictError(f"run {key.run_id} already finished as {row['status']}")
        return await self.read_run(key)

    async def resolve_interrupt(self, key: RunKey, wait_id: str, resolution: Any) -> ResolveOutcome:
        """Resolve an interrupt of the run's current wait set, or store an early resolution of a declared one.

        Returns ``resolved`` (the waiting run wakes), ``stored_early`` (consumed when the run reaches a wait on
        that interrupt) or ``duplicate`` (an exact repeat). An undeclared, unregistered name is a typo."""
        async with self.transaction("resolve interrupt") as conn:
            run = await fetch_run(conn, key, "status, checkpoint_seq, graph_name, graph_version, descriptor", lock=True)
            cur = await conn.execute(
                "SELECT wait_set, resolved_at, resolution FROM adx_agent_waits WHERE tenant_id = %s AND run_id = %s"
                " AND wait_id = %s AND kind = 'interrupt' ORDER BY wait_set DESC LIMIT 1",
                (key.tenant_id, key.run_id, wait_id),
            )
            wait = await cur.fetchone()
            current = wait is not None and run["status"] == "waiting" and run["checkpoint_seq"] == wait["wait_set"]
            if wait is not None and wait["resolved_at"] is not None:
                # An exact repeat of the last resolution of this name is a retry (a lost acknowledgement), even
                # after the run moved on; it never becomes an early resolution of a later wait.
                if wait["resolution"] == resolution:
                    return ResolveOutcome.DUPLICATE
                if current or run["status"] in TERMINAL:
                    raise ConflictError(f"interrupt {wait_id!r} was already resolved differently")
            declared = run["descriptor"].get("interrupts") or []
            if wait is None and wait_id not in declared:
                graph = f"{run['graph_name']}@{run['graph_version']}"
                if declared:
                    raise InvalidInputError("wait_id", f"graph {graph} declares no interrupt {wait_id!r} ({declared})")
                raise NotFoundError(
                    f"run {key.run_id} has no interrupt {wait_id!r}; graph {graph} declares no interrupts, so"
                    " only a run waiting on it can be resolved (declare interrupts=[...] to resolve early)"
                )
            if run["status"] in TERMINAL:
                raise ConflictError(f"run {key.run_id} already finished as {run['status']}")
            if not current and wait_id in declared:
                return await self._store_early(conn, key, wait_id, resolution)
            if not current or wait is None:
                raise ConflictError(f"interrupt {wait_id!r} is no longer pending (run is {run['status']})")
            await conn.execute(
                "UPDATE adx_agent_waits SET resolved_at = now(), resolution = %s WHERE tenant_id = %s"
                " AND run_id = %s AND wait_set = %s AND wait_id = %s",
                (Jsonb(resolution), key.tenant_id, key.run_id, wait["wait_set"], wait_id),
            )
            await conn.execute(
                "UPDATE adx_agent_runs SET wake_at = now(), revision = revision + 1, updated_at = now()"
                " WHERE tenant_id = %s AND run_id = %s",
                (key.tenant_id, key.run_id),
            )
        return ResolveOutcome.RESOLVED

    async def _store_early(self, conn: Conn, key: RunKey, wait_id: str, resolution: Any) -> ResolveOutcome:
        cur = await conn.execute(
            "INSERT INTO adx_agent_early_resolutions (tenant_id, run_id, wait_id, resolution) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, run_id, wait_id) WHERE consumed_at IS NULL DO NOTHING RETURNING 1",
            (key.tenant_id, key.run_id, wait_id, Jsonb(resolution)),
        )
        if await cur.fetchone() is not None:
            return ResolveOutcome.STORED_EARLY
        cur = await conn.execute(
            "SELECT resolution FROM adx_agent_early_resolutions WHERE tenant_id = %s AND run_id = %s"
            " AND wait_id = %s AND consumed_at IS NULL",
            (key.tenant_id, key.run_id, wait_id),
        )
        row = await cur.fetchone()
        if row is not None and row["resolution"] == resolution:
            return ResolveOutcome.DUPLICATE
        raise ConflictError(f"interrupt {wait_id!r} already has a different early resolution")

    # --- operator reads and actions ----------------------------------------------------------------------

    async def list_runs(
        self,
        tenant_id: str,
        *,
        status: str | None,
        graph: str | None,
        before: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[RunView]:
        """One keyset page of a tenant's runs, newest first (``before``: the last row of the previous page)."""
        async with self.connection("list runs") as conn:
            cur = await conn.execute(
                f"SELECT {RUN_COLUMNS} FROM adx_agent_runs r JOIN adx_agent_usage u USING (tenant_id, run_id)"
                " WHERE r.tenant_id = %(t)s AND (%(status)s::text IS NULL OR r.status = %(status)s)"
                " AND (%(graph)s::text IS NULL OR r.graph_name = %(graph)s)"
                " AND (%(at)s::timestamptz IS NULL OR (r.created_at, r.run_id) < (%(at)s, %(id)s))"
                " ORDER BY r.created_at DESC, r.run_id DESC LIMIT %(limit)s",
                {
                    "t": tenant_id,
                    "status": status,
                    "graph": graph,
                    "at": before[0] if before else None,
                    "id": before[1] if before else None,
                    "limit": limit,
                },
            )
            return [run_view(row) for row in await cur.fetchall()]

    async def read_history(self, key: RunKey) -> list[RunEvent]:
        """The run's journal (driver and lifecycle events) and operator actions, in commit order."""
        async with self.connection("run history") as conn:
            await fetch_run(conn, key, "1")
            cur = await conn.execute(
                "SELECT event_id AS id, kind, fence, revision, checkpoint_seq, created_at, payload"
                " FROM adx_agent_events WHERE tenant_id = %(t)s AND run_id = %(r)s"
                " UNION ALL SELECT action_id, 'retried', NULL, NULL, to_seq, created_at,"
                "   jsonb_build_object('from_checkpoint', from_seq, 'prior_status', prior_status)"
                " FROM adx_agent_run_actions WHERE tenant_id = %(t)s AND run_id = %(r)s"
                " ORDER BY created_at, checkpoint_seq",
                {"t": key.tenant_id, "r": key.run_id},
            )
            return [run_event(row) for row in await cur.fetchall()]

    async def retry_run(self, key: RunKey) -> None:
        """A failed run goes on from the last checkpoint before its failure, in ONE transaction: a copy of that
        checkpoint (and its waits) becomes current, the failure result moves to the action record, the run is
        queued. The next claim takes a higher fence as always; node attempts start afresh at the new step."""
        async with self.transaction("retry run") as conn:
            run = await fetch_run(conn, key, "status, checkpoint_seq, fence", lock=True)
            if run["status"] != RunStatus.FAILED:
                raise ConflictError(f"only a failed run can be retried; run {key.run_id} is {run['status']}")
            cur = await conn.execute(
                "SELECT seq, kind, next_node, state FROM adx_agent_checkpoints WHERE tenant_id = %s AND run_id = %s"
                " AND seq < %s AND kind <> 'terminal' AND next_node IS NOT NULL ORDER BY seq DESC LIMIT 1",
                (key.tenant_id, key.run_id, run["checkpoint_seq"]),
            )
            source = await cur.fetchone()
            if source is None:
                raise ConflictError(f"run {key.run_id} has no checkpoint to go on from")
            new_seq = int(run["checkpoint_seq"]) + 1
            params = {"t": key.tenant_id, "r": key.run_id, "src": source["seq"], "new": new_seq, "f": run["fence"]}
            await conn.execute(
                "INSERT INTO adx_agent_checkpoints (tenant_id, run_id, seq, kind, next_node, state, fence)"
                " SELECT tenant_id, run_id, %(new)s, kind, next_node, state, %(f)s FROM adx_agent_checkpoints"
                " WHERE tenant_id = %(t)s AND run_id = %(r)s AND seq = %(src)s",
                params,
            )
            if source["kind"] == CheckpointKind.WAIT:
                await conn.execute(
                    "INSERT INTO adx_agent_waits (tenant_id, run_id, wait_set, wait_id, kind, payload, timer_ms,"
                    " registered_at, due_at, resolved_at, resolution, event_id) SELECT tenant_id, run_id, %(new)s,"
                    " wait_id, kind, payload, timer_ms, registered_at, due_at, resolved_at, resolution, event_id"
                    " FROM adx_agent_waits WHERE tenant_id = %(t)s AND run_id = %(r)s AND wait_set = %(src)s",
                    params,
                )
            cur = await conn.execute(
                "DELETE FROM adx_agent_results WHERE tenant_id = %(t)s AND run_id = %(r)s RETURNING result", params
            )
            prior = await cur.fetchone()
            await conn.execute(
                "INSERT INTO adx_agent_run_actions (action_id, tenant_id, run_id, action, from_seq, to_seq,"
                " prior_status, prior_result) VALUES (%s, %s, %s, 'retry', %s, %s, 'failed', %s)",
                (
                    uuid.uuid4(),
                    key.tenant_id,
                    key.run_id,
                    source["seq"],
                    new_seq,
                    Jsonb(prior["result"]) if prior else None,
                ),
            )
            await conn.execute(
                "UPDATE adx_agent_runs SET status = 'queued', checkpoint_seq = %(new)s, revision = revision + 1,"
                " terminal_event_id = NULL, finished_at = NULL, children_settled_at = NULL, wake_at = NULL,"
                " available_at = now(),"
                " queue_seq = nextval('adx_agent_queue_seq'), updated_at = now()"
                " WHERE tenant_id = %(t)s AND run_id = %(r)s",
                params,
            )

    async def fork_run(self, key: RunKey, checkpoint_seq: int, new_run_id: uuid.UUID) -> None:
        """A new run of the same graph, request and budget that starts from a copy of ``checkpoint_seq`` of
        ``key`` (any status), in ONE transaction. Its descriptor names where it was forked from; its usage starts
        at zero; the source run is not touched."""
        async with self.transaction("fork run") as conn:
            run = await fetch_run(conn, key, "graph_name, graph_version, descriptor, request, budget")
            source = await fetch_checkpoint(conn, key, checkpoint_seq)
            if source is None:
                cur = await conn.execute(
                    "SELECT array_agg(seq ORDER BY seq) AS kept FROM adx_agent_checkpoints WHERE tenant_id = %s"
                    " AND run_id = %s AND next_node IS NOT NULL",
                    (key.tenant_id, key.run_id),
                )
                kept = await cur.fetchone()
                raise NotFoundError(
                    f"run {key.run_id} keeps no checkpoint {checkpoint_seq} (kept: {(kept or {}).get('kept') or []})"
                )
            if source.next_node is None:
                raise ConflictError(f"checkpoint {checkpoint_seq} is the run's end: nothing to go on with")
            descriptor = {**run["descriptor"], "forked_from": {"run_id": str(key.run_id), "checkpoint": checkpoint_seq}}
            await conn.execute(
                "INSERT INTO adx_agent_runs (tenant_id, run_id, graph_name, graph_version, status, descriptor, request,"
                " budget) VALUES (%s, %s, %s, %s, 'queued', %s, %s, %s)",
                (
                    key.tenant_id,
                    new_run_id,
                    run["graph_name"],
                    run["graph_version"],
                    Jsonb(descriptor),
                    Jsonb(run["request"]),
                    Jsonb(run["budget"]),
                ),
            )
            await conn.execute(
                "INSERT INTO adx_agent_usage (tenant_id, run_id) VALUES (%s, %s)", (key.tenant_id, new_run_id)
            )
            # The fork starts at step 0 from the chosen state; a wait checkpoint's node runs again and waits anew.
            await conn.execute(
                "INSERT INTO adx_agent_checkpoints (tenant_id, run_id, seq, kind, next_node, state, fence)"
                " VALUES (%s, %s, 0, 'initial', %s, %s, 0)",
                (key.tenant_id, new_run_id, source.next_node, Jsonb(source.state)),
            )
