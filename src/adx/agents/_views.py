"""The public read models of runs: a run's view (status, usage, pending waits), its committed result, one entry
of its history, and a page of runs; built here from the store's rows so every read (one run, a page, a run's
children, a cancellation request) hands out the same typed record."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from adx.agents._canonical import JsonObject
from adx.agents._rows import usage_of
from adx.agents._status import RunStatus, WaitKind

__all__ = ["AgentResult", "PendingWait", "RunEvent", "RunPage", "RunView", "agent_result", "run_event", "run_view"]


@dataclass(frozen=True, slots=True)
class PendingWait:
    wait_id: str
    kind: WaitKind
    payload: Any
    registered_at: datetime
    due_at: datetime | None
    resolved: bool


@dataclass(frozen=True, slots=True)
class RunView:
    tenant_id: str
    run_id: uuid.UUID
    graph: str
    graph_version: str
    status: RunStatus
    revision: int
    fence: int
    checkpoint_seq: int
    cancel_requested: bool
    leased: bool
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    usage: dict[str, int]
    waits: tuple[PendingWait, ...]
    parent_run_id: uuid.UUID | None = None  # set for a child run (spawned by a node of that run)
    children: int = 0  # child runs this run spawned
    children_settled: bool = False  # finished, and so are all its children (maintenance settled them)

    @property
    def finished(self) -> bool:
        return self.status.finished


@dataclass(frozen=True, slots=True)
class AgentResult:
    run_id: uuid.UUID
    status: RunStatus
    artifact: Any
    failure: JsonObject | None
    usage: dict[str, int]
    revision: int
    event_id: uuid.UUID
    created_at: datetime
    document: JsonObject


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One entry of a run's history: a journal event (node committed, waiting, succeeded, released, ...) or
    an operator action (``retried``)."""

    id: uuid.UUID
    kind: str
    fence: int | None
    revision: int | None
    checkpoint_seq: int
    created_at: datetime
    payload: JsonObject


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: tuple[RunView, ...]
    next_cursor: str | None  # pass as ``cursor`` for the next (older) page; None on the last page


def run_view(row: Mapping[str, Any], waits: Iterable[Mapping[str, Any]] = ()) -> RunView:
    """The view of a run row read with its usage (``RUN_COLUMNS``) and the pending waits of its current set."""
    return RunView(
        tenant_id=row["tenant_id"],
        run_id=row["run_id"],
        graph=row["graph_name"],
        graph_version=row["graph_version"],
        status=RunStatus(row["status"]),
        revision=int(row["revision"]),
        fence=int(row["fence"]),
        checkpoint_seq=int(row["checkpoint_seq"]),
        cancel_requested=row["cancel_requested_at"] is not None,
        leased=row["lease_owner"] is not None,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
        usage=usage_of(row),
        waits=tuple(
            PendingWait(
                w["wait_id"],
                WaitKind(w["kind"]),
                w["payload"],
                w["registered_at"],
                w["due_at"],
                w["resolved_at"] is not None,
            )
            for w in waits
        ),
        parent_run_id=row.get("parent_run_id"),
        children=int(row.get("children") or 0),
        children_settled=row.get("children_settled_at") is not None,
    )


def run_event(row: Mapping[str, Any]) -> RunEvent:
    """A history row: a journal event, or an operator action (no fence or revision of its own)."""
    return RunEvent(
        row["id"],
        row["kind"],
        None if row["fence"] is None else int(row["fence"]),
        None if row["revision"] is None else int(row["revision"]),
        int(row["checkpoint_seq"]),
        row["created_at"],
        row["payload"],
    )


def agent_result(run_id: uuid.UUID, row: Mapping[str, Any]) -> AgentResult:
    """A committed result row; ``document`` is the result as committed (its digest is journaled)."""
    doc = row["result"]
    return AgentResult(
        run_id=run_id,
        status=RunStatus(row["status"]),
        artifact=doc.get("artifact"),
        failure=doc.get("failure"),
        usage=row["usage"],
        revision=int(row["revision"]),
        event_id=row["event_id"],
        created_at=row["created_at"],
        document=doc,
    )
