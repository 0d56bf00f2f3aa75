"""What the agent store reads and hands out: run keys, checkpoints, claims, commit results, the SQL
fragments that decide when a run is claimable, and the two reads every kind of store transaction starts from
(a run's row, a checkpoint)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypedDict

from psycopg import AsyncCursor
from psycopg.abc import Params
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from adx.agents._canonical import JsonObject
from adx.agents._errors import StaleFenceError
from adx.agents._pg import Conn
from adx.agents._schemas import SchemaRef
from adx.agents._status import AttemptStatus, CheckpointKind, RunStatus, Wake
from adx.errors import NotFoundError

__all__ = [
    "CLAIMABLE",
    "LIVENESS_LOCK_CLASS",
    "RUN_COLUMNS",
    "TERMINAL",
    "USAGE_COLS",
    "USAGE_KEYS",
    "CallAttempt",
    "Candidate",
    "Checkpoint",
    "Claim",
    "EvidenceFacts",
    "NodeCommitResult",
    "ParentClaim",
    "RegisteredWait",
    "ResolveOutcome",
    "RunKey",
    "TerminalFacts",
    "WaitCommit",
    "WaitRegistration",
    "edge_params",
    "fenced_row",
    "fetch_checkpoint",
    "fetch_one",
    "fetch_run",
    "usage_of",
]

#: The finished statuses, as the status column spells them.
TERMINAL: tuple[str, ...] = tuple(s.value for s in RunStatus if s.finished)


class ResolveOutcome(StrEnum):
    RESOLVED = "resolved"
    STORED_EARLY = "stored_early"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True, order=True)
class RunKey:
    tenant_id: str
    run_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Checkpoint:
    seq: int
    kind: CheckpointKind
    next_node: str | None
    state: Any
    artifact: Any


class WaitRegistration(TypedDict):
    """One wait a node registers (a NodeWaits entry, validated): stored with ``jsonb_to_recordset``, so it stays
    a JSON object; ``timer_ms`` only for a timer, ``payload`` the interrupt's or join's JSON."""

    wait_id: str
    kind: str
    payload: Any
    timer_ms: int | None


@dataclass(frozen=True, slots=True)
class CallAttempt:
    """One recorded dispatch of a model or tool call of a step: ``started`` until its outcome is recorded."""

    attempt_id: uuid.UUID
    status: AttemptStatus
    fence: int
    response: Any
    usage: dict[str, int] | None


@dataclass(frozen=True, slots=True)
class Candidate:
    run_id: uuid.UUID
    queue_seq: int
    revision: int
    claimable: bool


@dataclass(frozen=True, slots=True)
class Claim:
    """What a successful claim hands the driver (read in the claim transaction)."""

    key: RunKey
    owner: str
    claim_id: uuid.UUID
    fence: int
    revision: int
    graph_name: str
    graph_version: str
    descriptor: JsonObject
    request: JsonObject
    budget: JsonObject
    checkpoint: Checkpoint
    cancel_requested: bool
    wake: tuple[Wake, ...]  # the wait set the run resumes from (a checkpoint of kind 'wait'); else empty
    usage: dict[str, int]
    node_attempt_id: uuid.UUID | None
    prior_attempts: int


@dataclass(frozen=True, slots=True)
class ParentClaim:
    """The run spawning a child, as its worker holds it (the spawn is fenced like any worker write)."""

    run_id: uuid.UUID
    fence: int
    owner: str


@dataclass(frozen=True, slots=True)
class EvidenceFacts:
    """One read-only snapshot of a run for lifecycle evidence: its admitted facts and ownership, the checkpoint
    asked for (None when it is not kept), usage rebuilt from completed attempts, and how many completed model
    calls recorded no usage (evidence refuses to report those as zero)."""

    descriptor: JsonObject
    request: JsonObject
    budget: JsonObject
    fence: int
    status: str
    lease_owner: str | None
    checkpoint: Checkpoint | None
    usage: dict[str, int]
    missing_usage: int


@dataclass(frozen=True, slots=True)
class TerminalFacts:
    """What a lost-acknowledgement replay of a terminal edge reads back: the run as it is now, the event it
    asks about, and the committed result (None when no result row exists)."""

    status: str
    revision: int
    lease_owner: str | None
    terminal_event_id: uuid.UUID | None
    event_fence: int
    event_revision: int
    event_kind: str
    result: JsonObject | None
    usage: dict[str, int] | None
    result_status: str | None


class RegisteredWait(TypedDict):
    """One wait of a committed wait set, as registered (database time)."""

    wait_id: str
    kind: str
    payload: Any
    timer_ms: int | None
    registered_at: datetime
    due_at: datetime | None


class WaitCommit(TypedDict):
    """A committed wait edge as recorded: its journal event, whether the node attempt it consumed completed,
    whether its checkpoint is still kept, and its immutable registrations. Handed out as
    :attr:`LifecycleResult.wait <adx.agents.LifecycleResult>`, which callers index, so it stays a dict."""

    event_id: uuid.UUID
    kind: str
    fence: int
    revision: int
    checkpoint_seq: int
    payload: JsonObject
    created_at: datetime
    attempt_status: str | None
    checkpoint_present: bool
    waits: list[RegisteredWait]


@dataclass(frozen=True, slots=True)
class NodeCommitResult:
    revision: int
    cancel_requested: bool
    usage: dict[str, int]
    next_attempt_id: uuid.UUID | None


#: A run's usage counters: the adx_agent_usage columns, and the keys of every usage document.
USAGE_KEYS = ("input_tokens", "output_tokens", "model_calls", "tool_calls", "node_commits")
USAGE_COLS = ", ".join(USAGE_KEYS)
#: What a run's view reads: the run row and its running usage (``FROM adx_agent_runs r JOIN adx_agent_usage u``).
RUN_COLUMNS = "r.*, " + ", ".join(f"u.{k}" for k in USAGE_KEYS) + ", u.missing_usage"


def usage_of(row: Any) -> dict[str, int]:
    return {k: int(row[k]) for k in USAGE_KEYS}


#: The first key of every worker's liveness advisory lock (two-int4 form: this, hashtext(identity)).
LIVENESS_LOCK_CLASS = 0x41474E54
# The lease owner is dead: its liveness lock is free (its database session is gone) AND its heartbeat is
# older than its grace. Either alone is not enough: a slow live worker keeps its lock; a worker whose session
# broke but whose process lives stops its in-flight work when its next heartbeat fails, before the grace ends.
OWNER_DEAD = f"""EXISTS (SELECT 1 FROM adx_agent_workers w WHERE w.identity = lease_owner
        AND w.heartbeat_at < now() - make_interval(secs => w.grace_ms / 1000.0)
        AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
            AND l.classid = {LIVENESS_LOCK_CLASS} AND l.objid = w.lock_key::oid AND l.objsubid = 2
            AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())))"""
# A run is claimable when it is live, due, and nobody holds an unexpired lease of a live worker; a waiting
# run when a wait fired (wake_at reached) or cancellation was requested.
CLAIMABLE = f"""(
    available_at <= now() AND (
        (status IN ('queued', 'running') AND (lease_expires_at IS NULL OR lease_expires_at <= now()
            OR {OWNER_DEAD}))
        OR (status = 'waiting' AND (wake_at <= now() OR cancel_requested_at IS NOT NULL))))"""


async def fetch_one(conn: Conn, query: str, params: Params, missing: str) -> DictRow:
    """The one row ``query`` selects; NotFoundError(``missing``) when there is none."""
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    if row is None:
        raise NotFoundError(missing)
    return row


async def fetch_run(conn: Conn, key: RunKey, columns: str, *, lock: bool = False) -> DictRow:
    """``columns`` of the run's row (locked FOR UPDATE when ``lock``); NotFoundError when there is no such run."""
    return await fetch_one(
        conn,
        f"SELECT {columns} FROM adx_agent_runs WHERE tenant_id = %s AND run_id = %s{' FOR UPDATE' if lock else ''}",
        (key.tenant_id, key.run_id),
        f"run {key.run_id} does not exist",
    )


async def fenced_row(cur: AsyncCursor[DictRow], run_id: uuid.UUID, fence: int, step: int | None = None) -> DictRow:
    """The row a fenced write returned. None means the write changed nothing: the fence or lease owner (or,
    with ``step``, the run's step) moved on, so the caller no longer owns the run."""
    row = await cur.fetchone()
    if row is None:
        at = "" if step is None else f" at step {step}"
        raise StaleFenceError(f"run {run_id}: fence {fence}{at} is no longer {'held' if step is None else 'current'}")
    return row


async def fetch_checkpoint(conn: Conn, key: RunKey, seq: int) -> Checkpoint | None:
    """Checkpoint ``seq`` of the run, or None when it is not kept (never written, or pruned by retention)."""
    cur = await conn.execute(
        "SELECT seq, kind, next_node, state, artifact FROM adx_agent_checkpoints"
        " WHERE tenant_id = %s AND run_id = %s AND seq = %s",
        (key.tenant_id, key.run_id, seq),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return Checkpoint(int(row["seq"]), CheckpointKind(row["kind"]), row["next_node"], row["state"], row["artifact"])


def edge_params(claim: Claim, event_id: uuid.UUID, schema: SchemaRef, event: JsonObject) -> dict[str, object]:
    """The named parameters every fenced edge statement shares: the run (``t``, ``r``), the fence and owner it
    holds (``f``, ``o``) and the journal event it writes (``eid``, ``sid``, ``sdig``, ``payload``)."""
    return {
        "t": claim.key.tenant_id,
        "r": claim.key.run_id,
        "f": claim.fence,
        "o": claim.owner,
        "eid": event_id,
        "sid": schema.schema_id,
        "sdig": schema.digest,
        "payload": Jsonb(event),
    }
