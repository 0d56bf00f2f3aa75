"""The agent runtime's queries: every transaction on a run, one lifecycle edge each.

Each public coroutine that changes a run is exactly one SQL transaction. Worker writes are fenced: they name the
fence and lease owner they hold, and change nothing when either moved on. The pool and error translation are
:mod:`adx.agents._pg`, the schema :mod:`adx.agents._migrations`, the records handed out :mod:`adx.agents._rows`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from adx.agents._admission import Admission
from adx.agents._errors import StaleFenceError
from adx.agents._migrations import check_schema, migrate
from adx.agents._pg import CommitHook, Conn, Database, check_tenant, open_pool
from adx.agents._rows import (
    CLAIMABLE,
    TERMINAL,
    USAGE_COLS,
    Candidate,
    Checkpoint,
    Claim,
    NodeCommitResult,
    ParentClaim,
    ResolveOutcome,
    RunKey,
    usage_of,
)
from adx.errors import ConflictError, InvalidInputError, NotFoundError, UnavailableError

__all__ = ["AgentStore"]

log = logging.getLogger("adx.agents.store")


@dataclass
class AgentStore(Database):
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
                if await cur.fetchone() is None:
                    raise StaleFenceError(f"run {parent.run_id}: fence {parent.fence} is no longer held")
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

    async def read_run(self, key: RunKey) -> dict[str, Any]:
        async with self.connection("get run") as conn:
            cur = await conn.execute(
                "SELECT r.*, u.input_tokens, u.output_tokens, u.model_calls, u.tool_calls, u.node_commits,"
                " u.missing_usage FROM adx_agent_runs r JOIN adx_agent_usage u USING (tenant_id, run_id)"
                " WHERE r.tenant_id = %s AND r.run_id = %s",
                (key.tenant_id, key.run_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"run {key.run_id} does not exist")
            cur = await conn.execute(
                "SELECT wait_id, kind, payload, registered_at, due_at, resolved_at FROM adx_agent_waits"
                " WHERE tenant_id = %s AND run_id = %s AND wait_set = %s ORDER BY wait_id",
                (key.tenant_id, key.run_id, row["checkpoint_seq"]),
            )
            waits = await cur.fetchall() if row["status"] == "waiting" else []
            return {**row, "waits": waits}

    async def read_result(self, key: RunKey) -> dict[str, Any] | None:
        async with self.connection("get result") as conn:
            cur = await conn.execute(
                "SELECT status, result, usage, event_id, revision, created_at FROM adx_agent_results"
                " WHERE tenant_id = %s AND run_id = %s",
                (key.tenant_id, key.run_id),
            )
            return await cur.fetchone()

    async def request_cancellation(self, key: RunKey) -> dict[str, Any]:
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
                cur = await conn.execute(
                    "SELECT status, cancel_requested_at FROM adx_agent_runs WHERE tenant_id = %s AND run_id = %s",
                    (key.tenant_id, key.run_id),
                )
                row = await cur.fetchone()
                if row is None:
                    raise NotFoundError(f"run {key.run_id} does not exist")
                if row["cancel_requested_at"] is None and row["status"] != "cancelled":
                    raise ConflictError(f"run {key.run_id} already finished as {row['status']}")
        return await self.read_run(key)

    async def resolve_interrupt(self, key: RunKey, wait_id: str, resolution: Any) -> ResolveOutcome:
        """Resolve an interrupt of the run's current wait set, or store an early resolution of a declared one.

        Returns ``resolved`` (the waiting run wakes), ``stored_early`` (consumed when the run reaches a wait on
        that interrupt) or ``duplicate`` (an exact repeat). An undeclared, unregistered name is a typo."""
        async with self.transaction("resolve interrupt") as conn:
            cur = await conn.execute(
                "SELECT status, checkpoint_seq, graph_name, graph_version, descriptor FROM adx_agent_runs"
                " WHERE tenant_id = %s AND run_id = %s FOR UPDATE",
                (key.tenant_id, key.run_id),
            )
            run = await cur.fetchone()
            if run is None:
                raise NotFoundError(f"run {key.run_id} does not exist")
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

    # --- scheduling --------------------------------------------------------------------------------------

    async def scan_cutoff(self) -> int:
        async with self.connection("scan cutoff") as conn:
            cur = await conn.execute("SELECT last_value, is_called FROM adx_agent_queue_seq")
            row = await cur.fetchone()
            assert row is not None
            return int(row["last_value"]) if row["is_called"] else 0

    async def scan_page(self, tenant_id: str, cutoff: int, after: int, limit: int) -> list[Candidate]:
        """One keyset page of live runs in durable queue order, at or below the fixed cutoff."""
        async with self.connection("scan runs") as conn:
            cur = await conn.execute(
                f"SELECT run_id, queue_seq, revision, {CLAIMABLE} AS claimable FROM adx_agent_runs"
                " WHERE tenant_id = %s AND status IN ('queued', 'running', 'waiting')"
                " AND queue_seq > %s AND queue_seq <= %s ORDER BY queue_seq LIMIT %s",
                (tenant_id, after, cutoff, limit),
            )
            return [
                Candidate(r["run_id"], int(r["queue_seq"]), int(r["revision"]), bool(r["claimable"]))
                for r in await cur.fetchall()
            ]

    async def claim(
        self, key: RunKey, *, revision: int, owner: str, claim_id: uuid.UUID, lease_s: float
    ) -> Claim | None:
        """Claim one run with a higher fence (one transaction), or None on ordinary contention."""
        async with self.transaction("claim run") as conn:
            cur = await conn.execute(
                "WITH c AS (SELECT tenant_id, run_id, status FROM adx_agent_runs WHERE tenant_id = %s AND run_id = %s"
                f" AND revision = %s AND {CLAIMABLE} FOR UPDATE SKIP LOCKED)"
                " UPDATE adx_agent_runs r SET fence = r.fence + 1, lease_owner = %s, claim_id = %s,"
                " lease_expires_at = now() + make_interval(secs => %s), status = 'running', wake_at = NULL,"
                " revision = r.revision + 1, updated_at = now() FROM c"
                " WHERE r.tenant_id = c.tenant_id AND r.run_id = c.run_id"
                " RETURNING r.*, c.status AS prior_status",
                (key.tenant_id, key.run_id, revision, owner, claim_id, lease_s),
            )
            run = await cur.fetchone()
            if run is None:
                return None
            return await self._claim_body(conn, key, run, owner, claim_id)

    async def find_claim(self, key: RunKey, *, owner: str, claim_id: uuid.UUID) -> Claim | None:
        """After an uncertain claim: the claim is ours iff the row still carries our claim ID and owner."""
        async with self.transaction("reconcile claim") as conn:
            cur = await conn.execute(
                "SELECT r.*, 'running' AS prior_status FROM adx_agent_runs r WHERE tenant_id = %s AND run_id = %s"
                " AND claim_id = %s AND lease_owner = %s FOR UPDATE",
                (key.tenant_id, key.run_id, claim_id, owner),
            )
            run = await cur.fetchone()
            if run is None:
                return None
            return await self._claim_body(conn, key, run, owner, claim_id)

    async def _claim_body(self, conn: Conn, key: RunKey, run: dict[str, Any], owner: str, claim_id: uuid.UUID) -> Claim:
        fence = int(run["fence"])
        seq = int(run["checkpoint_seq"])
        cur = await conn.execute(
            "SELECT seq, kind, next_node, state, artifact FROM adx_agent_checkpoints"
            " WHERE tenant_id = %s AND run_id = %s AND seq = %s",
            (key.tenant_id, key.run_id, seq),
        )
        ck = await cur.fetchone()
        if ck is None:
            raise UnavailableError(f"run {key.run_id}: checkpoint {seq} is missing")
        checkpoint = Checkpoint(int(ck["seq"]), ck["kind"], ck["next_node"], ck["state"], ck["artifact"])
        wake: list[dict[str, Any]] = []
        if ck["kind"] == "wait":
            cur = await conn.execute(
                "SELECT wait_id, kind, payload, resolution, resolved_at IS NOT NULL AS resolved,"
                " (due_at IS NOT NULL AND due_at <= now()) AS fired FROM adx_agent_waits"
                " WHERE tenant_id = %s AND run_id = %s AND wait_set = %s ORDER BY wait_id",
                (key.tenant_id, key.run_id, seq),
            )
            wake = [dict(r) for r in await cur.fetchall()]
        # Node attempts at this step by lower fences that never finished died with their worker. Model and
        # tool attempts stay 'started': their outcome is unknown, and the tool's idempotency decides.
        await conn.execute(
            "UPDATE adx_agent_attempts SET status = 'abandoned', finished_at = now() WHERE tenant_id = %s"
            " AND run_id = %s AND step = %s AND kind = 'node' AND status = 'started' AND fence < %s",
            (key.tenant_id, key.run_id, seq, fence),
        )
        cur = await conn.execute(
            "SELECT count(*) AS n FROM adx_agent_attempts WHERE tenant_id = %s AND run_id = %s AND step = %s"
            " AND kind = 'node' AND status IN ('abandoned', 'failed')",
            (key.tenant_id, key.run_id, seq),
        )
        prior = await cur.fetchone()
        cur = await conn.execute(
            f"SELECT {USAGE_COLS} FROM adx_agent_usage WHERE tenant_id = %s AND run_id = %s",
            (key.tenant_id, key.run_id),
        )
        usage = await cur.fetchone()
        assert prior is not None and usage is not None
        return Claim(
            key=key,
            owner=owner,
            claim_id=claim_id,
            fence=fence,
            revision=int(run["revision"]),
            graph_name=run["graph_name"],
            graph_version=run["graph_version"],
            descriptor=run["descriptor"],
            request=run["request"],
            budget=run["budget"],
            checkpoint=checkpoint,
            cancel_requested=run["cancel_requested_at"] is not None,
            wake=wake,
            usage=usage_of(usage),
            node_attempt_id=None,
            prior_attempts=int(prior["n"]),
        )

    async def start_node_attempt(self, claim: Claim, node: str) -> uuid.UUID:
        """Record a node attempt before dispatch (fenced)."""
        attempt_id = uuid.uuid4()
        async with self.transaction("start node attempt", single_statement=True) as conn:
            cur = await conn.execute(
                "INSERT INTO adx_agent_attempts (attempt_id, tenant_id, run_id, step, node, kind, call_key, fence,"
                " status) SELECT %s, tenant_id, run_id, %s, %s, 'node', %s, fence, 'started' FROM adx_agent_runs"
                " WHERE tenant_id = %s AND run_id = %s AND fence = %s AND lease_owner = %s RETURNING 1",
                (
                    attempt_id,
                    claim.checkpoint.seq,
                    node,
                    node,
                    claim.key.tenant_id,
                    claim.key.run_id,
                    claim.fence,
                    claim.owner,
                ),
            )
            if await cur.fetchone() is None:
                raise StaleFenceError(f"run {claim.key.run_id}: fence {claim.fence} is no longer held")
        return attempt_id

    async def renew_lease(self, key: RunKey, fence: int, owner: str, lease_s: float) -> bool:
        """Extend our lease; False when the fence or owner moved on (we lost the run)."""
        async with self.transaction("renew lease", single_statement=True) as conn:
            cur = await conn.execute(
                "UPDATE adx_agent_runs SET lease_expires_at = now() + make_interval(secs => %s)"
                " WHERE tenant_id = %s AND run_id = %s AND fence = %s AND lease_owner = %s RETURNING 1",
                (lease_s, key.tenant_id, key.run_id, fence, owner),
            )
            return await cur.fetchone() is not None

    # --- model and tool attempts -------------------------------------------------------------------------

    async def find_call(self, key: RunKey, step: int, kind: str, call_key: str) -> list[dict[str, Any]]:
        async with self.connection("find call") as conn:
            cur = await conn.execute(
                "SELECT attempt_id, status, fence, response, usage FROM adx_agent_attempts WHERE tenant_id = %s"
                " AND run_id = %s AND step = %s AND kind = %s AND call_key = %s ORDER BY started_at",
                (key.tenant_id, key.run_id, step, kind, call_key),
            )
            return list(await cur.fetchall())

    async def start_call(
        self, key: RunKey, *, fence: int, owner: str, step: int, node: str, kind: str, call_key: str, request: Any
    ) -> uuid.UUID:
        """Record a model/tool call before it is dispatched (fenced)."""
        attempt_id = uuid.uuid4()
        async with self.transaction(f"start {kind} call", single_statement=True) as conn:
            cur = await conn.execute(
                "INSERT INTO adx_agent_attempts (attempt_id, tenant_id, run_id, step, node, kind, call_key, fence,"
                " status, request) SELECT %s, tenant_id, run_id, %s, %s, %s, %s, fence, 'started', %s"
                " FROM adx_agent_runs WHERE tenant_id = %s AND run_id = %s AND fence = %s AND lease_owner = %s"
                " RETURNING 1",
                (attempt_id, step, node, kind, call_key, Jsonb(request), key.tenant_id, key.run_id, fence, owner),
            )
            if await cur.fetchone() is None:
                raise StaleFenceError(f"run {key.run_id}: fence {fence} is no longer held")
        return attempt_id

    async def finish_call(
        self,
        key: RunKey,
        attempt_id: uuid.UUID,
        *,
        fence: int,
        owner: str,
        kind: str,
        response: Any,
        usage: dict[str, int] | None,
        error: str | None = None,
    ) -> None:
        """Record the outcome of a call and count it in the running usage, in one transaction."""
        status = "failed" if error is not None else "completed"
        async with self.transaction(f"finish {kind} call") as conn:
            cur = await conn.execute(
                "UPDATE adx_agent_attempts a SET status = %s, response = %s, usage = %s, error = %s,"
                " finished_at = now() FROM adx_agent_runs r WHERE a.attempt_id = %s AND a.status = 'started'"
                " AND r.tenant_id = a.tenant_id AND r.run_id = a.run_id AND r.fence = %s AND r.lease_owner = %s"
                " RETURNING 1",
                (
                    status,
                    Jsonb(response),
                    Jsonb(usage) if usage is not None else None,
                    error,
                    attempt_id,
                    fence,
                    owner,
                ),
            )
            if await cur.fetchone() is None:
                raise StaleFenceError(f"run {key.run_id}: fence {fence} is no longer held")
            if status == "completed":
                await conn.execute(
                    "UPDATE adx_agent_usage SET input_tokens = input_tokens + %s, output_tokens = output_tokens + %s,"
                    " model_calls = model_calls + %s, tool_calls = tool_calls + %s,"
                    " missing_usage = missing_usage + %s WHERE tenant_id = %s AND run_id = %s",
                    (
                        (usage or {}).get("input_tokens", 0),
                        (usage or {}).get("output_tokens", 0),
                        1 if kind == "model" else 0,
                        1 if kind == "tool" else 0,
                        1 if kind == "model" and usage is None else 0,
                        key.tenant_id,
                        key.run_id,
                    ),
                )

    # --- node commit (driver event) ----------------------------------------------------------------------

    async def commit_node(
        self,
        claim: Claim,
        *,
        attempt_id: uuid.UUID,
        step: int,
        next_node: str | None,
        state: Any,
        artifact: Any,
        event_id: uuid.UUID,
        event: dict[str, Any],
        schema: tuple[str, str],
        lease_s: float,
        hooks: Sequence[CommitHook] = (),
    ) -> NodeCommitResult:
        """Commit one node step: checkpoint, journal event, attempt completion, usage, next attempt, lease."""
        new_seq = step + 1
        next_attempt = uuid.uuid4() if next_node is not None else None
        k = claim.key
        async with self.transaction("commit node", single_statement=not hooks) as conn:
            cur = await conn.execute(
                "WITH r AS (UPDATE adx_agent_runs SET checkpoint_seq = %(seq)s, revision = revision + 1,"
                "   updated_at = now(), lease_expires_at = now() + make_interval(secs => %(lease)s)"
                "   WHERE tenant_id = %(t)s AND run_id = %(r)s AND fence = %(f)s AND lease_owner = %(o)s"
                "   AND checkpoint_seq = %(step)s RETURNING revision, cancel_requested_at),"
                " c AS (INSERT INTO adx_agent_checkpoints (tenant_id, run_id, seq, kind, next_node, state, artifact,"
                "   fence) SELECT %(t)s, %(r)s, %(seq)s, 'node', %(next)s, %(state)s, %(artifact)s, %(f)s FROM r),"
                " e AS (INSERT INTO adx_agent_events (event_id, tenant_id, run_id, kind, schema_id, schema_digest,"
                "   fence, revision, checkpoint_seq, payload) SELECT %(eid)s, %(t)s, %(r)s, 'node_committed',"
                "   %(sid)s, %(sdig)s, %(f)s, r.revision, %(seq)s, %(payload)s FROM r),"
                " a AS (UPDATE adx_agent_attempts SET status = 'completed', finished_at = now()"
                "   WHERE attempt_id = %(aid)s AND EXISTS (SELECT 1 FROM r)),"
                " n AS (INSERT INTO adx_agent_attempts (attempt_id, tenant_id, run_id, step, node, kind, call_key,"
                "   fence, status) SELECT %(naid)s, %(t)s, %(r)s, %(seq)s, %(next)s, 'node', %(next)s, %(f)s,"
                "   'started' FROM r WHERE %(naid)s::uuid IS NOT NULL),"
                " d AS (DELETE FROM adx_agent_checkpoints WHERE tenant_id = %(t)s AND run_id = %(r)s"
                "   AND seq <= %(seq)s - %(keep)s AND EXISTS (SELECT 1 FROM r)),"
                " u AS (UPDATE adx_agent_usage SET node_commits = node_commits + 1 WHERE tenant_id = %(t)s"
                f"   AND run_id = %(r)s AND EXISTS (SELECT 1 FROM r) RETURNING {USAGE_COLS})"
                f" SELECT r.revision, r.cancel_requested_at IS NOT NULL AS cancel, {USAGE_COLS} FROM r, u",
                {
                    "seq": new_seq,
                    "lease": lease_s,
                    "t": k.tenant_id,
                    "r": k.run_id,
                    "f": claim.fence,
                    "o": claim.owner,
                    "step": step,
                    "next": next_node,
                    "state": Jsonb(state),
                    "artifact": Jsonb(artifact) if artifact is not None else None,
                    "eid": event_id,
                    "sid": schema[0],
                    "sdig": schema[1],
                    "payload": Jsonb(event),
                    "aid": attempt_id,
                    "naid": next_attempt,
                    "keep": self.checkpoint_retention,
                },
            )
            row = await cur.fetchone()
            if row is None:
                raise StaleFenceError(f"run {k.run_id}: fence {claim.fence} at step {step} is no longer current")
            for hook in hooks:
                await hook(conn)
        return NodeCommitResult(int(row["revision"]), bool(row["cancel"]), usage_of(row), next_attempt)

    # --- lifecycle edges ---------------------------------------------------------------------------------

    async def commit_wait(
        self,
        claim: Claim,
        *,
        attempt_id: uuid.UUID,
        step: int,
        resume_node: str,
        state: Any,
        waits: list[dict[str, Any]],
        event_id: uuid.UUID,
        event: dict[str, Any],
        schema: tuple[str, str],
    ) -> dict[str, Any]:
        """AGT-5 in ONE statement: journal event, result consumption, successor checkpoint, waits registered
        with database time, status Waiting, lease released."""
        timers = [w["timer_ms"] for w in waits if w["kind"] == "timer"]
        k = claim.key
        async with self.transaction("commit wait") as conn:
            cur = await conn.execute(
                "WITH r AS (UPDATE adx_agent_runs SET status = 'waiting', checkpoint_seq = %(seq)s,"
                "   revision = revision + 1, lease_owner = NULL, lease_expires_at = NULL, claim_id = NULL,"
                "   wake_at = now() + make_interval(secs => %(min_timer)s::bigint / 1000.0), updated_at = now()"
                "   WHERE tenant_id = %(t)s AND run_id = %(r)s AND fence = %(f)s AND lease_owner = %(o)s"
                "   AND checkpoint_seq = %(step)s RETURNING revision, now() AS at),"
                " c AS (INSERT INTO adx_agent_checkpoints (tenant_id, run_id, seq, kind, next_node, state, fence)"
                "   SELECT %(t)s, %(r)s, %(seq)s, 'wait', %(next)s, %(state)s, %(f)s FROM r),"
                " e AS (INSERT INTO adx_agent_events (event_id, tenant_id, run_id, kind, schema_id, schema_digest,"
                "   fence, revision, checkpoint_seq, payload) SELECT %(eid)s, %(t)s, %(r)s, 'waiting', %(sid)s,"
                "   %(sdig)s, %(f)s, r.revision, %(seq)s, %(payload)s FROM r),"
                " w AS (INSERT INTO adx_agent_waits (tenant_id, run_id, wait_set, wait_id, kind, payload, timer_ms,"
                "   registered_at, due_at, event_id) SELECT %(t)s, %(r)s, %(seq)s, x.wait_id, x.kind, x.payload,"
                "   x.timer_ms, r.at, r.at + make_interval(secs => x.timer_ms / 1000.0), %(eid)s"
                "   FROM r, jsonb_to_recordset(%(waits)s)"
                "   AS x(wait_id text, kind text, payload jsonb, timer_ms bigint)),"
                " a AS (UPDATE adx_agent_attempts SET status = 'completed', finished_at = now()"
                "   WHERE attempt_id = %(aid)s AND EXISTS (SELECT 1 FROM r)),"
                " u AS (UPDATE adx_agent_usage SET node_commits = node_commits + 1 WHERE tenant_id = %(t)s"
                "   AND run_id = %(r)s AND EXISTS (SELECT 1 FROM r))"
                " SELECT revision, at FROM r",
                {
                    "seq": step + 1,
                    "t": k.tenant_id,
                    "r": k.run_id,
                    "f": claim.fence,
                    "o": claim.owner,
                    "step": step,
                    "next": resume_node,
                    "state": Jsonb(state),
                    "eid": event_id,
                    "sid": schema[0],
                    "sdig": schema[1],
                    "payload": Jsonb(event),
                    "waits": Jsonb(waits),
                    "aid": attempt_id,
                    "min_timer": min(timers) if timers else None,
                },
            )
            row = await cur.fetchone()
            if row is None:
                raise StaleFenceError(f"run {k.run_id}: fence {claim.fence} at step {step} is no longer current")
            if any(w["kind"] == "interrupt" for w in waits):
                # A new statement after the run row is locked: it sees every early resolution committed before
                # us; a later resolver waits for our lock and then finds the run waiting.
                await conn.execute(
                    "WITH e AS (UPDATE adx_agent_early_resolutions SET consumed_at = now(), consumed_wait_set = %(seq)s"
                    "   WHERE tenant_id = %(t)s AND run_id = %(r)s AND consumed_at IS NULL AND wait_id IN"
                    "   (SELECT wait_id FROM adx_agent_waits WHERE tenant_id = %(t)s AND run_id = %(r)s"
                    "   AND wait_set = %(seq)s AND kind = 'interrupt') RETURNING wait_id, resolution),"
                    " w AS (UPDATE adx_agent_waits w SET resolved_at = now(), resolution = e.resolution FROM e"
                    "   WHERE w.tenant_id = %(t)s AND w.run_id = %(r)s AND w.wait_set = %(seq)s"
                    "   AND w.wait_id = e.wait_id)"
                    " UPDATE adx_agent_runs SET wake_at = now() WHERE tenant_id = %(t)s AND run_id = %(r)s"
                    " AND EXISTS (SELECT 1 FROM e)",
                    {"seq": step + 1, "t": k.tenant_id, "r": k.run_id},
                )
        return await self.read_wait_commit(k, event_id)

    async def read_wait_commit(self, key: RunKey, event_id: uuid.UUID) -> dict[str, Any]:
        """The committed wait edge as recorded: the event and its immutable registrations (event-first)."""
        async with self.connection("read wait commit") as conn:
            cur = await conn.execute(
                "SELECT e.event_id, e.kind, e.fence, e.revision, e.checkpoint_seq, e.payload, e.created_at,"
                " (SELECT status FROM adx_agent_attempts WHERE attempt_id = (e.payload->>'attempt_id')::uuid)"
                "   AS attempt_status,"
                " EXISTS (SELECT 1 FROM adx_agent_checkpoints c WHERE c.tenant_id = e.tenant_id"
                "   AND c.run_id = e.run_id AND c.seq = e.checkpoint_seq AND c.kind = 'wait') AS checkpoint_present"
                " FROM adx_agent_events e WHERE e.event_id = %s AND e.tenant_id = %s AND e.run_id = %s",
                (event_id, key.tenant_id, key.run_id),
            )
            event = await cur.fetchone()
            if event is None:
                raise NotFoundError(f"wait event {event_id} was not committed")
            cur = await conn.execute(
                "SELECT wait_id, kind, payload, timer_ms, registered_at, due_at FROM adx_agent_waits"
                " WHERE event_id = %s ORDER BY wait_id",
                (event_id,),
            )
            waits = [dict(r) for r in await cur.fetchall()]
        return {**event, "waits": waits}

    async def commit_terminal(
        self,
        claim: Claim,
        *,
        status: str,
        step: int,
        artifact: Any,
        result: dict[str, Any],
        usage: dict[str, int],
        event_id: uuid.UUID,
        event_kind: str,
        event: dict[str, Any],
        schema: tuple[str, str],
        attempt_id: uuid.UUID | None,
        error: str | None,
    ) -> dict[str, Any]:
        """AGT-6/7/8 in ONE statement: terminal checkpoint, result, status, cleared ownership, event."""
        k = claim.key
        async with self.transaction(f"commit {status}", single_statement=True) as conn:
            cur = await conn.execute(
                "WITH r AS (UPDATE adx_agent_runs SET status = %(status)s, checkpoint_seq = %(seq)s,"
                "   revision = revision + 1, lease_owner = NULL, lease_expires_at = NULL, claim_id = NULL,"
                "   wake_at = NULL, terminal_event_id = %(eid)s, finished_at = now(), updated_at = now()"
                "   WHERE tenant_id = %(t)s AND run_id = %(r)s AND fence = %(f)s AND lease_owner = %(o)s"
                "   AND checkpoint_seq = %(step)s RETURNING revision, finished_at),"
                " c AS (INSERT INTO adx_agent_checkpoints (tenant_id, run_id, seq, kind, next_node, state, artifact,"
                "   fence) SELECT %(t)s, %(r)s, %(seq)s, 'terminal', NULL, p.state, %(artifact)s, %(f)s"
                "   FROM r, adx_agent_checkpoints p WHERE p.tenant_id = %(t)s AND p.run_id = %(r)s"
                "   AND p.seq = %(step)s),"
                " s AS (INSERT INTO adx_agent_results (tenant_id, run_id, status, result, usage, event_id, revision)"
                "   SELECT %(t)s, %(r)s, %(status)s, %(result)s, %(usage)s, %(eid)s, r.revision FROM r),"
                " e AS (INSERT INTO adx_agent_events (event_id, tenant_id, run_id, kind, schema_id, schema_digest,"
                "   fence, revision, checkpoint_seq, payload) SELECT %(eid)s, %(t)s, %(r)s, %(kind)s, %(sid)s,"
                "   %(sdig)s, %(f)s, r.revision, %(seq)s, %(payload)s"
                "   FROM r),"
                " a AS (UPDATE adx_agent_attempts SET status = CASE WHEN %(error)s::text IS NULL THEN 'skipped'"
                "   ELSE 'failed' END, error = %(error)s, finished_at = now()"
                "   WHERE attempt_id = %(aid)s AND status = 'started' AND EXISTS (SELECT 1 FROM r))"
                " SELECT revision, finished_at FROM r",
                {
                    "status": status,
                    "seq": step + 1,
                    "eid": event_id,
                    "t": k.tenant_id,
                    "r": k.run_id,
                    "f": claim.fence,
                    "o": claim.owner,
                    "step": step,
                    "artifact": Jsonb(artifact) if artifact is not None else None,
                    "result": Jsonb(result),
                    "usage": Jsonb(usage),
                    "kind": event_kind,
                    "sid": schema[0],
                    "sdig": schema[1],
                    "payload": Jsonb(event),
                    "aid": attempt_id,
                    "error": error,
                },
            )
            row = await cur.fetchone()
            if row is None:
                raise StaleFenceError(f"run {k.run_id}: fence {claim.fence} at step {step} is no longer current")
            return dict(row)

    async def check_current(self, claim: Claim, step: int) -> None:
        """Fail fast (before any evidence read) when the handoff's fence, owner or step is no longer current."""
        async with self.connection("check ownership") as conn:
            cur = await conn.execute(
                "SELECT status, fence, lease_owner, checkpoint_seq FROM adx_agent_runs"
                " WHERE tenant_id = %s AND run_id = %s",
                (claim.key.tenant_id, claim.key.run_id),
            )
            row = await cur.fetchone()
        if row is None:
            raise StaleFenceError(f"run {claim.key.run_id} does not exist")
        if (
            row["status"] in TERMINAL
            or row["fence"] != claim.fence
            or row["lease_owner"] != claim.owner
            or row["checkpoint_seq"] != step
        ):
            raise StaleFenceError(
                f"run {claim.key.run_id}: handoff of fence {claim.fence} at step {step} is stale"
                f" (run is {row['status']}, fence {row['fence']}, step {row['checkpoint_seq']})"
            )

    async def read_terminal(self, key: RunKey, event_id: uuid.UUID) -> dict[str, Any] | None:
        """For a lost-ACK retry: the run's terminal facts and the committed event, or None if no such event."""
        async with self.connection("read terminal") as conn:
            cur = await conn.execute(
                "SELECT r.status, r.revision, r.lease_owner, r.terminal_event_id, e.fence AS event_fence,"
                " e.revision AS event_revision, e.kind AS event_kind, s.result, s.usage, s.status AS result_status"
                " FROM adx_agent_runs r JOIN adx_agent_events e ON e.event_id = %s"
                " AND e.tenant_id = r.tenant_id AND e.run_id = r.run_id"
                " LEFT JOIN adx_agent_results s ON s.tenant_id = r.tenant_id AND s.run_id = r.run_id"
                " WHERE r.tenant_id = %s AND r.run_id = %s",
                (event_id, key.tenant_id, key.run_id),
            )
            return await cur.fetchone()

    async def release(
        self,
        claim: Claim,
        *,
        reason: str,
        delay_s: float,
        requeue: bool,
        event_id: uuid.UUID,
        event: dict[str, Any],
        schema: tuple[str, str],
        attempt_id: uuid.UUID | None,
        attempt_status: str | None,
        error: str | None,
    ) -> int:
        """Give the run back (Deferred, Yielded, RecoveryReleased): ONE transaction clears our exact lease."""
        k = claim.key
        async with self.transaction("release run", single_statement=True) as conn:
            cur = await conn.execute(
                "WITH r AS (UPDATE adx_agent_runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL,"
                "   claim_id = NULL, revision = revision + 1, updated_at = now(),"
                "   available_at = now() + make_interval(secs => %(delay)s),"
                "   queue_seq = CASE WHEN %(requeue)s THEN nextval('adx_agent_queue_seq') ELSE queue_seq END"
                "   WHERE tenant_id = %(t)s AND run_id = %(r)s AND fence = %(f)s AND lease_owner = %(o)s"
                "   RETURNING revision, checkpoint_seq),"
                " e AS (INSERT INTO adx_agent_events (event_id, tenant_id, run_id, kind, schema_id, schema_digest,"
                "   fence, revision, checkpoint_seq, payload) SELECT %(eid)s, %(t)s, %(r)s, 'released', %(sid)s,"
                "   %(sdig)s, %(f)s, r.revision, r.checkpoint_seq, %(payload)s FROM r),"
                " a AS (UPDATE adx_agent_attempts SET status = %(astatus)s, error = %(error)s, finished_at = now()"
                "   WHERE attempt_id = %(aid)s AND status = 'started' AND %(astatus)s::text IS NOT NULL"
                "   AND EXISTS (SELECT 1 FROM r))"
                " SELECT revision FROM r",
                {
                    "delay": delay_s,
                    "requeue": requeue,
                    "t": k.tenant_id,
                    "r": k.run_id,
                    "f": claim.fence,
                    "o": claim.owner,
                    "eid": event_id,
                    "sid": schema[0],
                    "sdig": schema[1],
                    "payload": Jsonb({**event, "reason": reason[:1024]}),
                    "aid": attempt_id,
                    "astatus": attempt_status,
                    "error": error,
                },
            )
            row = await cur.fetchone()
            if row is None:
                raise StaleFenceError(f"run {k.run_id}: fence {claim.fence} is no longer held")
            return int(row["revision"])

    # --- evidence (read-only, bounded) -------------------------------------------------------------------

    async def read_evidence(self, key: RunKey, checkpoint_seq: int) -> dict[str, Any]:
        """Admission facts, the checkpoint, and usage rebuilt from completed attempts, in one read-only
        snapshot with a short statement timeout (bounded, deterministic, no side effects)."""
        async with self.connection("read evidence") as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            await conn.execute("SET LOCAL statement_timeout = 5000")
            cur = await conn.execute(
                "SELECT descriptor, request, budget, fence, status, lease_owner FROM adx_agent_runs"
                " WHERE tenant_id = %s AND run_id = %s",
                (key.tenant_id, key.run_id),
            )
            run = await cur.fetchone()
            if run is None:
                raise NotFoundError(f"run {key.run_id} does not exist")
            cur = await conn.execute(
                "SELECT seq, kind, next_node, state, artifact FROM adx_agent_checkpoints"
                " WHERE tenant_id = %s AND run_id = %s AND seq = %s",
                (key.tenant_id, key.run_id, checkpoint_seq),
            )
            checkpoint = await cur.fetchone()
            cur = await conn.execute(
                "SELECT coalesce(sum((usage->>'input_tokens')::bigint) FILTER (WHERE kind = 'model'), 0)"
                "   AS input_tokens,"
                " coalesce(sum((usage->>'output_tokens')::bigint) FILTER (WHERE kind = 'model'), 0) AS output_tokens,"
                " count(*) FILTER (WHERE kind = 'model') AS model_calls,"
                " count(*) FILTER (WHERE kind = 'tool') AS tool_calls,"
                " count(*) FILTER (WHERE kind = 'node') AS node_commits,"
                " count(*) FILTER (WHERE kind = 'model' AND usage IS NULL) AS missing_usage"
                " FROM adx_agent_attempts WHERE tenant_id = %s AND run_id = %s AND status = 'completed'",
                (key.tenant_id, key.run_id),
            )
            usage = await cur.fetchone()
        assert usage is not None
        return {"run": run, "checkpoint": checkpoint, "usage": dict(usage)}
