"""The maintenance role's tasks (AGT-15): for each, the discovery query (one keyset page of a tenant in the
task's order) and the action on one item. Each action is one or more single-item transactions that are
idempotent, so a replica or a restarted process repeating one changes nothing."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from adx.agents._children import decode_join, live_children, publish_join, settle_children
from adx.agents._graph import JoinPolicy
from adx.agents._rows import RunKey
from adx.agents._store import AgentStore
from adx.errors import ConflictError

__all__ = ["MaintenanceItem", "MaintenanceTask", "act", "discover"]

_LIVE = "('queued', 'running', 'waiting')"


class MaintenanceTask(StrEnum):
    """In the order one tick runs them: a deadline cancels a parent before its children are propagated to."""

    DEADLINES = "deadline_cancellation"
    CHILD_CANCELLATION = "child_cancellation"
    FAILURE_CONVERGENCE = "failure_convergence"
    JOIN_PUBLICATION = "join_publication"
    CHILD_SETTLEMENT = "child_settlement"


@dataclass(frozen=True, slots=True)
class MaintenanceItem:
    at: datetime  # with run_id, the keyset position in the task's order
    run_id: uuid.UUID
    wait_set: int | None
    wait_id: str | None
    payload: Any


def _after(at: str, run: str) -> str:
    return f"(%(at)s::timestamptz IS NULL OR ({at}, {run}) > (%(at)s, %(id)s))"


# A join's child, tested without decoding the registration (a malformed one must not break discovery).
_IN_JOIN = "w.payload->'children' ? c.run_id::text"
_OPEN_JOIN = (
    "FROM adx_agent_waits w JOIN adx_agent_runs r ON r.tenant_id = w.tenant_id AND r.run_id = w.run_id"
    " AND r.checkpoint_seq = w.wait_set AND r.status = 'waiting' AND r.cancel_requested_at IS NULL"
    " WHERE w.tenant_id = %(t)s AND w.kind = 'join' AND w.resolved_at IS NULL"
)
_NO_WAIT = "NULL::bigint AS wait_set, NULL::text AS wait_id, NULL::jsonb AS payload"
_CHILD = "SELECT 1 FROM adx_agent_runs c WHERE c.tenant_id = w.tenant_id AND c.parent_run_id = w.run_id"

_PAGES: dict[MaintenanceTask, str] = {
    MaintenanceTask.DEADLINES: (
        f"SELECT deadline_at AS at, run_id, {_NO_WAIT} FROM adx_agent_runs WHERE tenant_id = %(t)s"
        f" AND deadline_at IS NOT NULL AND status IN {_LIVE}"
        f" AND cancel_requested_at IS NULL AND deadline_at <= now() AND {_after('deadline_at', 'run_id')}"
        " ORDER BY deadline_at, run_id LIMIT %(n)s"
    ),
    # Propagation: the parent was asked to cancel, or ended failed or cancelled; its live children go too.
    MaintenanceTask.CHILD_CANCELLATION: (
        f"SELECT c.created_at AS at, c.run_id, {_NO_WAIT} FROM adx_agent_runs c"
        " JOIN adx_agent_runs p ON p.tenant_id = c.tenant_id AND p.run_id = c.parent_run_id"
        f" WHERE c.tenant_id = %(t)s AND c.parent_run_id IS NOT NULL AND c.status IN {_LIVE}"
        " AND c.cancel_requested_at IS NULL AND (p.cancel_requested_at IS NOT NULL OR p.status IN ('failed',"
        f" 'cancelled')) AND {_after('c.created_at', 'c.run_id')} ORDER BY c.created_at, c.run_id LIMIT %(n)s"
    ),
    MaintenanceTask.FAILURE_CONVERGENCE: (
        f"SELECT w.registered_at AS at, w.run_id, w.wait_set, w.wait_id, w.payload {_OPEN_JOIN}"
        f" AND w.payload->>'policy' = '{JoinPolicy.FAIL_FAST.value}'"
        f" AND EXISTS ({_CHILD} AND c.status IN ('failed', 'cancelled') AND {_IN_JOIN})"
        f" AND EXISTS ({_CHILD} AND c.status IN {_LIVE} AND c.cancel_requested_at IS NULL AND {_IN_JOIN})"
        f" AND {_after('w.registered_at', 'w.run_id')} ORDER BY w.registered_at, w.run_id LIMIT %(n)s"
    ),
    # Only joins whose named children are all finished: a join still waiting costs nothing per pass.
    MaintenanceTask.JOIN_PUBLICATION: (
        f"SELECT w.registered_at AS at, w.run_id, w.wait_set, w.wait_id, w.payload {_OPEN_JOIN}"
        f" AND NOT EXISTS ({_CHILD} AND c.status IN {_LIVE} AND {_IN_JOIN})"
        f" AND {_after('w.registered_at', 'w.run_id')} ORDER BY w.registered_at, w.run_id LIMIT %(n)s"
    ),
    MaintenanceTask.CHILD_SETTLEMENT: (
        f"SELECT finished_at AS at, run_id, {_NO_WAIT} FROM adx_agent_runs p"
        " WHERE tenant_id = %(t)s AND children > 0 AND children_settled_at IS NULL AND finished_at IS NOT NULL"
        f" AND NOT EXISTS (SELECT 1 FROM adx_agent_runs c WHERE c.tenant_id = p.tenant_id"
        f"   AND c.parent_run_id = p.run_id AND c.status IN {_LIVE})"
        f" AND {_after('finished_at', 'run_id')} ORDER BY finished_at, run_id LIMIT %(n)s"
    ),
}


async def discover(
    store: AgentStore, task: MaintenanceTask, tenant: str, after: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[MaintenanceItem]:
    """One keyset page of the task's items for a tenant, after ``after`` (None: from the start)."""
    async with store.connection(f"maintenance: {task.value} page") as conn:
        cur = await conn.execute(
            _PAGES[task],
            {"t": tenant, "at": after[0] if after else None, "id": after[1] if after else None, "n": limit},
        )
        rows = await cur.fetchall()
    return [MaintenanceItem(r["at"], r["run_id"], r["wait_set"], r["wait_id"], r["payload"]) for r in rows]


async def _cancel(store: AgentStore, key: RunKey) -> bool:
    try:
        await store.request_cancellation(key)
    except ConflictError:  # it finished meanwhile: nothing left to cancel
        return False
    return True


async def act(store: AgentStore, task: MaintenanceTask, tenant: str, item: MaintenanceItem) -> int:
    """Act on one item; returns how many changes it made (an AdxError: the item failed, the page goes on)."""
    key = RunKey(tenant, item.run_id)
    if task in (MaintenanceTask.DEADLINES, MaintenanceTask.CHILD_CANCELLATION):
        return int(await _cancel(store, key))
    if task is MaintenanceTask.CHILD_SETTLEMENT:
        return int(await settle_children(store, key))
    assert item.wait_set is not None and item.wait_id is not None
    if task is MaintenanceTask.JOIN_PUBLICATION:
        return int(await publish_join(store, key, item.wait_set, item.wait_id))
    spec = decode_join(item.payload)  # FAILURE_CONVERGENCE
    if spec.policy is not JoinPolicy.FAIL_FAST:
        return 0
    done = 0
    for child in await live_children(store, key, spec.children):
        done += int(await _cancel(store, RunKey(tenant, child)))
    return done
