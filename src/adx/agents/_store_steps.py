"""The agent store's worker-side step transactions: the scheduler's scan, claims and leases, node attempts,
recorded model and tool calls, and the node commit. Every write is fenced: it names the fence and lease owner
it holds and changes nothing when either moved on."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from adx.agents._canonical import JsonObject
from adx.agents._pg import CommitHook, Conn, Database
from adx.agents._rows import (
    CLAIMABLE,
    USAGE_COLS,
    CallAttempt,
    Candidate,
    Claim,
    NodeCommitResult,
    RunKey,
    edge_params,
    fenced_row,
    fetch_checkpoint,
    usage_of,
)
from adx.agents._schemas import SchemaRef
from adx.agents._status import AttemptStatus, CheckpointKind, Wake
from adx.errors import UnavailableError

__all__ = ["StepQueries"]


class StepQueries(Database):
    """Claim-to-commit transactions of :class:`~adx.agents._store.AgentStore` (a mixin over its pool)."""

    #: Checkpoints kept per run (older ones are pruned by the node commit); a field of the store.
    checkpoint_retention: int

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

    async def _claim_body(self, conn: Conn, key: RunKey, run: DictRow, owner: str, claim_id: uuid.UUID) -> Claim:
        fence = int(run["fence"])
        seq = int(run["checkpoint_seq"])
        checkpoint = await fetch_checkpoint(conn, key, seq)
        if checkpoint is None:
            raise UnavailableError(f"run {key.run_id}: checkpoint {seq} is missing")
        wake: tuple[Wake, ...] = ()
        if checkpoint.kind is CheckpointKind.WAIT:
            cur = await conn.execute(
                "SELECT wait_id, kind, payload, resolution, resolved_at IS NOT NULL AS resolved,"
                " (due_at IS NOT NULL AND due_at <= now()) AS fired FROM adx_agent_waits"
                " WHERE tenant_id = %s AND run_id = %s AND wait_set = %s ORDER BY wait_id",
                (key.tenant_id, key.run_id, seq),
            )
            wake = tuple(Wake.from_row(r) for r in await cur.fetchall())
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
            await fenced_row(cur, claim.key.run_id, claim.fence)
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

    async def find_call(self, key: RunKey, step: int, kind: str, call_key: str) -> list[CallAttempt]:
        """Every recorded dispatch of this call at this step, oldest first."""
        async with self.connection("find call") as conn:
            cur = await conn.execute(
                "SELECT attempt_id, status, fence, response, usage FROM adx_agent_attempts WHERE tenant_id = %s"
                " AND run_id = %s AND step = %s AND kind = %s AND call_key = %s ORDER BY started_at",
                (key.tenant_id, key.run_id, step, kind, call_key),
            )
            return [
                CallAttempt(r["attempt_id"], AttemptStatus(r["status"]), int(r["fence"]), r["response"], r["usage"])
                for r in await cur.fetchall()
            ]

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
            await fenced_row(cur, key.run_id, fence)
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
        status = AttemptStatus.FAILED if error is not None else AttemptStatus.COMPLETED
        async with self.transaction(f"finish {kind} call") as conn:
            cur = await conn.execute(
                "UPDATE adx_agent_attempts a SET status = %s, response = %s, usage = %s, error = %s,"
                " finished_at = now() FROM adx_agent_runs r WHERE a.attempt_id = %s AND a.status = 'started'"
                " AND r.tenant_id = a.tenant_id AND r.run_id = a.run_id AND r.fence = %s AND r.lease_owner = %s"
                " RETURNING 1",
                (
                    status.value,
                    Jsonb(response),
                    Jsonb(usage) if usage is not None else None,
                    error,
                    attempt_id,
                    fence,
                    owner,
                ),
            )
            await fenced_row(cur, key.run_id, fence)
            if status is AttemptStatus.COMPLETED:
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
        event: JsonObject,
        schema: SchemaRef,
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
                    **edge_params(claim, event_id, schema, event),
                    "seq": new_seq,
                    "lease": lease_s,
                    "step": step,
                    "next": next_node,
                    "state": Jsonb(state),
                    "artifact": Jsonb(artifact) if artifact is not None else None,
                    "aid": attempt_id,
                    "naid": next_attempt,
                    "keep": self.checkpoint_retention,
                },
            )
            row = await fenced_row(cur, k.run_id, claim.fence, step)
            for hook in hooks:
                await hook(conn)
        return NodeCommitResult(int(row["revision"]), bool(row["cancel"]), usage_of(row), next_attempt)
