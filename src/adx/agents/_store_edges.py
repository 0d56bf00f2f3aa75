"""The agent store's lifecycle edges: the wait, terminal and release commits (each ONE statement or
transaction, fenced), what a lost-acknowledgement replay reads back, and the read-only evidence snapshot."""

from __future__ import annotations

import uuid
from typing import Any, cast

from psycopg.types.json import Jsonb

from adx.agents._canonical import JsonObject
from adx.agents._errors import StaleFenceError
from adx.agents._handoffs import ReleaseHandoff, WaitHandoff
from adx.agents._pg import Database
from adx.agents._rows import (
    TERMINAL,
    Claim,
    EvidenceFacts,
    RegisteredWait,
    RunKey,
    TerminalFacts,
    WaitCommit,
    edge_params,
    fenced_row,
    fetch_checkpoint,
    fetch_one,
    fetch_run,
    usage_of,
)
from adx.agents._schemas import SchemaRef
from adx.agents._status import RunStatus

__all__ = ["EdgeQueries"]


class EdgeQueries(Database):
    """Lifecycle-edge transactions of :class:`~adx.agents._store.AgentStore` (a mixin over its pool)."""

    # --- lifecycle edges ---------------------------------------------------------------------------------

    async def commit_wait(self, h: WaitHandoff, *, event: JsonObject, schema: SchemaRef) -> WaitCommit:
        """AGT-5 in ONE statement: journal event, result consumption, successor checkpoint, waits registered
        with database time, status Waiting, lease released."""
        claim, step, waits = h.claim, h.step, h.waits
        timers = [w["timer_ms"] for w in waits if w["kind"] == "timer" and w["timer_ms"] is not None]
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
                    **edge_params(claim, h.event_id, schema, event),
                    "seq": step + 1,
                    "step": step,
                    "next": h.resume_node,
                    "state": Jsonb(h.state),
                    "waits": Jsonb(list(waits)),
                    "aid": h.attempt_id,
                    "min_timer": min(timers) if timers else None,
                },
            )
            await fenced_row(cur, k.run_id, claim.fence, step)
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
        return await self.read_wait_commit(k, h.event_id)

    async def read_wait_commit(self, key: RunKey, event_id: uuid.UUID) -> WaitCommit:
        """The committed wait edge as recorded: the event and its immutable registrations (event-first)."""
        async with self.connection("read wait commit") as conn:
            event = await fetch_one(
                conn,
                "SELECT e.event_id, e.kind, e.fence, e.revision, e.checkpoint_seq, e.payload, e.created_at,"
                " (SELECT status FROM adx_agent_attempts WHERE attempt_id = (e.payload->>'attempt_id')::uuid)"
                "   AS attempt_status,"
                " EXISTS (SELECT 1 FROM adx_agent_checkpoints c WHERE c.tenant_id = e.tenant_id"
                "   AND c.run_id = e.run_id AND c.seq = e.checkpoint_seq AND c.kind = 'wait') AS checkpoint_present"
                " FROM adx_agent_events e WHERE e.event_id = %s AND e.tenant_id = %s AND e.run_id = %s",
                (event_id, key.tenant_id, key.run_id),
                f"wait event {event_id} was not committed",
            )
            cur = await conn.execute(
                "SELECT wait_id, kind, payload, timer_ms, registered_at, due_at FROM adx_agent_waits"
                " WHERE event_id = %s ORDER BY wait_id",
                (event_id,),
            )
            # The columns selected are exactly the record's keys: the rows are the records.
            waits = cast(list[RegisteredWait], await cur.fetchall())
        return cast(WaitCommit, {**event, "waits": waits})

    async def commit_terminal(
        self,
        claim: Claim,
        *,
        status: RunStatus,
        step: int,
        artifact: Any,
        result: JsonObject,
        usage: dict[str, int],
        event_id: uuid.UUID,
        event_kind: str,
        event: JsonObject,
        schema: SchemaRef,
        attempt_id: uuid.UUID | None,
        error: str | None,
    ) -> int:
        """AGT-6/7/8 in ONE statement: terminal checkpoint, result, status, cleared ownership, event. Returns the
        run's new revision."""
        k = claim.key
        async with self.transaction(f"commit {status.value}", single_statement=True) as conn:
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
                    **edge_params(claim, event_id, schema, event),
                    "status": status.value,
                    "seq": step + 1,
                    "step": step,
                    "artifact": Jsonb(artifact) if artifact is not None else None,
                    "result": Jsonb(result),
                    "usage": Jsonb(usage),
                    "kind": event_kind,
                    "aid": attempt_id,
                    "error": error,
                },
            )
            row = await fenced_row(cur, k.run_id, claim.fence, step)
            return int(row["revision"])

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

    async def read_terminal(self, key: RunKey, event_id: uuid.UUID) -> TerminalFacts | None:
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
            row = await cur.fetchone()
        if row is None:
            return None
        return TerminalFacts(
            status=row["status"],
            revision=row["revision"],
            lease_owner=row["lease_owner"],
            terminal_event_id=row["terminal_event_id"],
            event_fence=row["event_fence"],
            event_revision=row["event_revision"],
            event_kind=row["event_kind"],
            result=row["result"],
            usage=row["usage"],
            result_status=row["result_status"],
        )

    async def release(self, h: ReleaseHandoff, *, requeue: bool, event: JsonObject, schema: SchemaRef) -> int:
        """Give the run back (Deferred, Yielded, RecoveryReleased): ONE transaction clears our exact lease."""
        claim = h.claim
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
                    **edge_params(claim, h.event_id, schema, {**event, "reason": h.reason[:1024]}),
                    "delay": h.delay_s,
                    "requeue": requeue,
                    "aid": h.attempt_id,
                    "astatus": h.attempt_status.value if h.attempt_status is not None else None,
                    "error": h.error,
                },
            )
            row = await fenced_row(cur, k.run_id, claim.fence)
            return int(row["revision"])

    # --- evidence (read-only, bounded) -------------------------------------------------------------------

    async def read_evidence(self, key: RunKey, checkpoint_seq: int) -> EvidenceFacts:
        """Admission facts, the checkpoint, and usage rebuilt from completed attempts, in one read-only
        snapshot with a short statement timeout (bounded, deterministic, no side effects)."""
        async with self.connection("read evidence") as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            await conn.execute("SET LOCAL statement_timeout = 5000")
            run = await fetch_run(conn, key, "descriptor, request, budget, fence, status, lease_owner")
            checkpoint = await fetch_checkpoint(conn, key, checkpoint_seq)
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
        return EvidenceFacts(
            descriptor=run["descriptor"],
            request=run["request"],
            budget=run["budget"],
            fence=int(run["fence"]),
            status=run["status"],
            lease_owner=run["lease_owner"],
            checkpoint=checkpoint,
            usage=usage_of(usage),
            missing_usage=int(usage["missing_usage"]),
        )
