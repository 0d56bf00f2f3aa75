"""What the agent store reads and hands out: run keys, checkpoints, claims, commit results, and the SQL
fragments that decide when a run is claimable."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "CLAIMABLE",
    "LIVENESS_LOCK_CLASS",
    "TERMINAL",
    "USAGE_COLS",
    "Candidate",
    "Checkpoint",
    "Claim",
    "NodeCommitResult",
    "ParentClaim",
    "ResolveOutcome",
    "RunKey",
    "usage_of",
]

TERMINAL = ("succeeded", "failed", "cancelled")


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
    kind: str
    next_node: str | None
    state: Any
    artifact: Any


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
    descriptor: dict[str, Any]
    request: dict[str, Any]
    budget: dict[str, Any]
    checkpoint: Checkpoint
    cancel_requested: bool
    wake: list[dict[str, Any]]
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
class NodeCommitResult:
    revision: int
    cancel_requested: bool
    usage: dict[str, int]
    next_attempt_id: uuid.UUID | None


USAGE_COLS = "input_tokens, output_tokens, model_calls, tool_calls, node_commits"


def usage_of(row: Any) -> dict[str, int]:
    return {k: int(row[k]) for k in ("input_tokens", "output_tokens", "model_calls", "tool_calls", "node_commits")}


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
