"""Operator reads and actions on runs (list, history, retry, fork): each one SQL transaction over the agent store."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from adx.agents._rows import RunKey
from adx.agents._store import AgentStore
from adx.errors import ConflictError, NotFoundError

__all__ = ["fork_run", "list_runs", "read_history", "retry_run"]

_RUN_COLUMNS = "r.*, u.input_tokens, u.output_tokens, u.model_calls, u.tool_calls, u.node_commits, u.missing_usage"


async def list_runs(
    store: AgentStore,
    tenant_id: str,
    *,
    status: str | None,
    graph: str | None,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[dict[str, Any]]:
    """One keyset page of a tenant's runs, newest first (``before``: the last row of the previous page)."""
    async with store.connection("list runs") as conn:
        cur = await conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM adx_agent_runs r JOIN adx_agent_usage u USING (tenant_id, run_id)"
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
        return [{**row, "waits": []} for row in await cur.fetchall()]


async def read_history(store: AgentStore, key: RunKey) -> list[dict[str, Any]]:
    """The run's journal (driver and lifecycle events) and operator actions, in commit order."""
    async with store.connection("run history") as conn:
        cur = await conn.execute(
            "SELECT 1 FROM adx_agent_runs WHERE tenant_id = %s AND run_id = %s", (key.tenant_id, key.run_id)
        )
        if await cur.fetchone() is None:
            raise NotFoundError(f"run {key.run_id} does not exist")
        cur = await conn.execute(
            "SELECT event_id AS id, kind, fence, revision, checkpoint_seq, created_at, payload"
            " FROM adx_agent_events WHERE tenant_id = %(t)s AND run_id = %(r)s"
            " UNION ALL SELECT action_id, 'retried', NULL, NULL, to_seq, created_at,"
            "   jsonb_build_object('from_checkpoint', from_seq, 'prior_status', prior_status)"
            " FROM adx_agent_run_actions WHERE tenant_id = %(t)s AND run_id = %(r)s"
            " ORDER BY created_at, checkpoint_seq",
            {"t": key.tenant_id, "r": key.run_id},
        )
        return list(await cur.fetchall())


async def retry_run(store: AgentStore, key: RunKey) -> None:
    """A failed run goes on from the last checkpoint before its failure, in ONE transaction: a copy of that
    checkpoint (and its waits) becomes current, the failure result moves to the action record, the run is
    queued. The next claim takes a higher fence as always; node attempts start afresh at the new step."""
    async with store.transaction("retry run") as conn:
        cur = await conn.execute(
            "SELECT status, checkpoint_seq, fence FROM adx_agent_runs WHERE tenant_id = %s AND run_id = %s FOR UPDATE",
            (key.tenant_id, key.run_id),
        )
        run = await cur.fetchone()
        if run is None:
            raise NotFoundError(f"run {key.run_id} does not exist")
        if run["status"] != "failed":
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
        if source["kind"] == "wait":
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


async def fork_run(store: AgentStore, key: RunKey, checkpoint_seq: int, new_run_id: uuid.UUID) -> None:
    """A new run of the same graph, request and budget that starts from a copy of ``checkpoint_seq`` of
    ``key`` (any status), in ONE transaction. Its descriptor names where it was forked from; its usage starts
    at zero; the source run is not touched."""
    async with store.transaction("fork run") as conn:
        cur = await conn.execute(
            "SELECT graph_name, graph_version, descriptor, request, budget FROM adx_agent_runs"
            " WHERE tenant_id = %s AND run_id = %s",
            (key.tenant_id, key.run_id),
        )
        run = await cur.fetchone()
        if run is None:
            raise NotFoundError(f"run {key.run_id} does not exist")
        cur = await conn.execute(
            "SELECT kind, next_node, state FROM adx_agent_checkpoints WHERE tenant_id = %s AND run_id = %s"
            " AND seq = %s",
            (key.tenant_id, key.run_id, checkpoint_seq),
        )
        source = await cur.fetchone()
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
        if source["next_node"] is None:
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
            (key.tenant_id, new_run_id, source["next_node"], Jsonb(source["state"])),
        )
