"""Child runs and joins: a node spawns child runs (``ctx.spawn``) and waits for them with a :class:`Join`.

A child is an ordinary run of the same tenant with ``parent_run_id`` set, admitted in one transaction that also
checks the parent's fence (a worker that lost the parent spawns nothing). Its run ID is derived from the parent,
the step and the call's key, so a node that runs again after a crash finds the children it spawned before
instead of spawning them twice. Everything after the spawn is the maintenance role's (:mod:`._maintenance`):
join publication, cancellation propagation and settlement, failure convergence; the queries for those are
here, each one transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from adx.agents._admission import build_admission
from adx.agents._canonical import JsonObject
from adx.agents._graph import ChildRun, ExecutableGraphRegistry, Join, JoinPolicy
from adx.agents._rows import RUN_COLUMNS, TERMINAL, Claim, ParentClaim, RunKey, WaitRegistration, fetch_run
from adx.agents._store import AgentStore
from adx.agents._views import RunView, run_view
from adx.errors import ConflictError, InvalidInputError

__all__ = [
    "JoinSpec",
    "decode_join",
    "join_json",
    "list_children",
    "live_children",
    "publish_join",
    "settle_children",
    "spawn_child",
]

MAX_JOIN_CHILDREN = 1000


async def spawn_child(
    store: AgentStore,
    executables: ExecutableGraphRegistry,
    claim: Claim,
    *,
    step: int,
    call_key: str,
    graph: str,
    version: str | None,
    input: Any,
    budget: JsonObject | None,
    deadline_seconds: float | None,
) -> ChildRun:
    if version is None:
        versions = sorted(g.version for g in executables.graphs() if g.name == graph)
        if len(versions) != 1:
            raise InvalidInputError("version", f"graph {graph!r} has versions {versions}: name one")
        version = versions[0]
    if deadline_seconds is not None and not 0 < deadline_seconds <= 366 * 86400:
        raise InvalidInputError("deadline_seconds", "must be positive and at most a year")
    admission = build_admission(executables, graph, version, input, budget)
    parent = claim.key.run_id
    # Stable across re-executions of the node: the same spawn finds the same child.
    child_id = uuid.uuid5(parent, f"spawn:{step}:{call_key}")
    run_id, _ = await store.admit(
        RunKey(claim.key.tenant_id, child_id),
        admission,
        idempotency_key=f"child:{child_id}",
        deadline_s=deadline_seconds,
        parent=ParentClaim(parent, claim.fence, claim.owner),
    )
    return ChildRun(run_id, admission.graph_name, admission.graph_version)


def join_json(join: Join) -> WaitRegistration:
    """The wait registration of a join: its children (in order) and policy, validated."""
    if not join.children or len(join.children) > MAX_JOIN_CHILDREN:
        raise InvalidInputError("waits.children", f"a Join needs 1 to {MAX_JOIN_CHILDREN} children")
    ids: list[str] = []
    for child in join.children:
        run_id = child.run_id if isinstance(child, ChildRun) else child
        if not isinstance(run_id, uuid.UUID):
            raise InvalidInputError("waits.children", f"{child!r} is not a ChildRun or a run UUID")
        ids.append(str(run_id))
    if len(set(ids)) != len(ids):
        raise InvalidInputError("waits.children", "names a child twice")
    try:
        policy = JoinPolicy(join.policy)
    except ValueError:
        raise InvalidInputError("waits.policy", f"must be one of {[p.value for p in JoinPolicy]}") from None
    return {
        "wait_id": join.wait_id,
        "kind": "join",
        "payload": {"children": ids, "policy": policy.value},
        "timer_ms": None,
    }


@dataclass(frozen=True, slots=True)
class JoinSpec:
    children: tuple[uuid.UUID, ...]
    policy: JoinPolicy


def decode_join(payload: Any) -> JoinSpec:
    """A join registration as stored; a malformed one (a poisoned row) is an InvalidInputError naming why."""
    if not isinstance(payload, dict) or not isinstance(payload.get("children"), list) or not payload["children"]:
        raise InvalidInputError("join.children", "is not a non-empty list")
    try:
        children = tuple(uuid.UUID(str(c)) for c in payload["children"])
        policy = JoinPolicy(payload.get("policy", "all"))
    except ValueError as exc:
        raise InvalidInputError("join", f"malformed registration: {exc}") from None
    return JoinSpec(children, policy)


async def list_children(
    store: AgentStore, key: RunKey, *, after: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[RunView]:
    """One keyset page of a run's children, oldest first (NotFoundError for an unknown parent)."""
    async with store.connection("list children") as conn:
        await fetch_run(conn, key, "1")
        cur = await conn.execute(
            f"SELECT {RUN_COLUMNS} FROM adx_agent_runs r JOIN adx_agent_usage u USING (tenant_id, run_id)"
            " WHERE r.tenant_id = %(t)s AND r.parent_run_id = %(p)s"
            " AND (%(at)s::timestamptz IS NULL OR (r.created_at, r.run_id) > (%(at)s, %(id)s))"
            " ORDER BY r.created_at, r.run_id LIMIT %(n)s",
            {
                "t": key.tenant_id,
                "p": key.run_id,
                "at": after[0] if after else None,
                "id": after[1] if after else None,
                "n": limit,
            },
        )
        return [run_view(row) for row in await cur.fetchall()]


async def publish_join(store: AgentStore, key: RunKey, wait_set: int, wait_id: str) -> bool:
    """Publish a join in ONE transaction once every child is finished: the wait is resolved with the children's
    outcomes and the parent wakes. False (nothing changed) while a child is live or the wait moved on."""
    async with store.transaction("publish join") as conn:
        cur = await conn.execute(
            "SELECT r.status, r.checkpoint_seq, w.payload, w.resolved_at FROM adx_agent_runs r"
            " JOIN adx_agent_waits w ON w.tenant_id = r.tenant_id AND w.run_id = r.run_id"
            " AND w.wait_set = %s AND w.wait_id = %s WHERE r.tenant_id = %s AND r.run_id = %s FOR UPDATE OF r",
            (wait_set, wait_id, key.tenant_id, key.run_id),
        )
        row = await cur.fetchone()
        if row is None or row["resolved_at"] is not None:
            return False
        if row["status"] != "waiting" or row["checkpoint_seq"] != wait_set:
            return False
        spec = decode_join(row["payload"])
        cur = await conn.execute(
            "SELECT c.run_id, c.graph_name, c.status, s.result FROM adx_agent_runs c LEFT JOIN adx_agent_results s"
            " USING (tenant_id, run_id) WHERE c.tenant_id = %s AND c.parent_run_id = %s AND c.run_id = ANY(%s)",
            (key.tenant_id, key.run_id, list(spec.children)),
        )
        found = {r["run_id"]: r for r in await cur.fetchall()}
        missing = [str(c) for c in spec.children if c not in found]
        if missing:
            raise ConflictError(f"join {wait_id!r} names runs that are not children of {key.run_id}: {missing[:3]}")
        if any(r["status"] not in TERMINAL or r["result"] is None for r in found.values()):
            return False
        outcomes = [
            {
                "run_id": str(c),
                "graph": found[c]["graph_name"],
                "status": found[c]["status"],
                "artifact": found[c]["result"].get("artifact"),
                "failure": found[c]["result"].get("failure"),
            }
            for c in spec.children
        ]
        await conn.execute(
            "UPDATE adx_agent_waits SET resolved_at = now(), resolution = %s WHERE tenant_id = %s AND run_id = %s"
            " AND wait_set = %s AND wait_id = %s",
            (Jsonb({"children": outcomes}), key.tenant_id, key.run_id, wait_set, wait_id),
        )
        await conn.execute(
            "UPDATE adx_agent_runs SET wake_at = now(), revision = revision + 1, updated_at = now()"
            " WHERE tenant_id = %s AND run_id = %s",
            (key.tenant_id, key.run_id),
        )
    return True


async def live_children(store: AgentStore, key: RunKey, among: tuple[uuid.UUID, ...] | None) -> list[uuid.UUID]:
    """The run's children (``among`` them, if given) that are live and not asked to cancel yet."""
    async with store.connection("live children") as conn:
        cur = await conn.execute(
            "SELECT run_id FROM adx_agent_runs WHERE tenant_id = %(t)s AND parent_run_id = %(r)s"
            " AND status IN ('queued', 'running', 'waiting') AND cancel_requested_at IS NULL"
            " AND (%(among)s::uuid[] IS NULL OR run_id = ANY(%(among)s::uuid[])) ORDER BY created_at, run_id",
            {"t": key.tenant_id, "r": key.run_id, "among": list(among) if among is not None else None},
        )
        return [r["run_id"] for r in await cur.fetchall()]


async def settle_children(store: AgentStore, key: RunKey) -> bool:
    """Mark a finished parent settled once none of its children is live (ONE statement); False while one is."""
    async with store.transaction("settle children", single_statement=True) as conn:
        cur = await conn.execute(
            "UPDATE adx_agent_runs p SET children_settled_at = now() WHERE p.tenant_id = %(t)s AND p.run_id = %(r)s"
            " AND p.children_settled_at IS NULL AND p.status IN ('succeeded', 'failed', 'cancelled')"
            " AND NOT EXISTS (SELECT 1 FROM adx_agent_runs c WHERE c.tenant_id = p.tenant_id"
            "   AND c.parent_run_id = p.run_id AND c.status IN ('queued', 'running', 'waiting')) RETURNING 1",
            {"t": key.tenant_id, "r": key.run_id},
        )
        return await cur.fetchone() is not None
