"""The Python submission and read API: admit runs, read runs and results, cancel, resolve interrupts.

Submission never starts a worker (AGT-13): it only writes the admitted run; workers pick it up.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from adx.agents._canonical import json_clone
from adx.agents._graph import Budget, ExecutableGraphRegistry
from adx.agents._store import AgentStore, ResolveOutcome, RunKey, check_tenant
from adx.errors import InvalidInputError

__all__ = ["AgentResult", "AgentRuns", "PendingWait", "RunView"]

_MAX_KEY = 200


@dataclass(frozen=True, slots=True)
class PendingWait:
    wait_id: str
    kind: str
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
    status: str
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

    @property
    def finished(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class AgentResult:
    run_id: uuid.UUID
    status: str
    artifact: Any
    failure: dict[str, Any] | None
    usage: dict[str, int]
    revision: int
    event_id: uuid.UUID
    created_at: datetime
    document: dict[str, Any]


def _parse_run_id(run_id: uuid.UUID | str) -> uuid.UUID:
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        raise InvalidInputError("run_id", f"{run_id!r} is not a UUID") from None


def _view(row: dict[str, Any]) -> RunView:
    return RunView(
        tenant_id=row["tenant_id"],
        run_id=row["run_id"],
        graph=row["graph_name"],
        graph_version=row["graph_version"],
        status=row["status"],
        revision=int(row["revision"]),
        fence=int(row["fence"]),
        checkpoint_seq=int(row["checkpoint_seq"]),
        cancel_requested=row["cancel_requested_at"] is not None,
        leased=row["lease_owner"] is not None,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
        usage={k: int(row[k]) for k in ("input_tokens", "output_tokens", "model_calls", "tool_calls", "node_commits")},
        waits=tuple(
            PendingWait(
                w["wait_id"], w["kind"], w["payload"], w["registered_at"], w["due_at"], w["resolved_at"] is not None
            )
            for w in row["waits"]
        ),
    )


class AgentRuns:
    """Admission and reads over one store, validated against one frozen executable registry."""

    def __init__(self, store: AgentStore, executables: ExecutableGraphRegistry) -> None:
        self.store = store
        self.executables = executables

    async def create_tenant(self, tenant_id: str) -> None:
        await self.store.ensure_tenant(tenant_id)

    async def submit(
        self,
        tenant_id: str,
        graph: str,
        version: str,
        input: Any,
        *,
        budget: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        run_id: uuid.UUID | None = None,
    ) -> RunView:
        """Admit a run atomically with its descriptor, request and resolved budget."""
        check_tenant(tenant_id)
        executable = self.executables.get(graph, version)
        try:
            request_input = json_clone(input)
        except ValueError as exc:
            raise InvalidInputError("input", str(exc)) from None
        self.executables.schemas.validate(executable.input_schema, request_input)
        resolved = Budget.resolve(executable.budget, budget)
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= _MAX_KEY
        ):
            raise InvalidInputError("idempotency_key", f"must be 1-{_MAX_KEY} characters")
        schemas = self.executables.schemas
        descriptor = {
            "agent": executable.name,
            "graph": executable.name,
            "graph_version": executable.version,
            "graph_digest": executable.digest,
            "input_schema": {"id": executable.input_schema, "digest": schemas.digest(executable.input_schema)},
            "output_schema": {"id": executable.output_schema, "digest": schemas.digest(executable.output_schema)},
        }
        if executable.interrupts:
            descriptor["interrupts"] = list(executable.interrupts)
        request = {"input": request_input}
        initial_state = request_input if isinstance(request_input, dict) else {"input": request_input}
        new_id, _ = await self.store.admit(
            RunKey(tenant_id, run_id or uuid.uuid4()),
            graph_name=executable.name,
            graph_version=executable.version,
            descriptor=descriptor,
            request=request,
            budget=resolved.to_json(),
            initial_state=initial_state,
            entry=executable.entry,
            idempotency_key=idempotency_key,
        )
        return await self.get_run(tenant_id, new_id)

    async def get_run(self, tenant_id: str, run_id: uuid.UUID | str) -> RunView:
        check_tenant(tenant_id)
        return _view(await self.store.read_run(RunKey(tenant_id, _parse_run_id(run_id))))

    async def get_result(self, tenant_id: str, run_id: uuid.UUID | str) -> AgentResult | None:
        """The committed result of a finished run; None while the run is not finished."""
        check_tenant(tenant_id)
        key = RunKey(tenant_id, _parse_run_id(run_id))
        row = await self.store.read_result(key)
        if row is None:
            await self.store.read_run(key)  # NotFoundError for an unknown run
            return None
        doc = row["result"]
        return AgentResult(
            run_id=key.run_id,
            status=row["status"],
            artifact=doc.get("artifact"),
            failure=doc.get("failure"),
            usage=row["usage"],
            revision=int(row["revision"]),
            event_id=row["event_id"],
            created_at=row["created_at"],
            document=doc,
        )

    async def request_cancellation(self, tenant_id: str, run_id: uuid.UUID | str) -> RunView:
        """Ask for cancellation; a driver confirms it (status ``cancelled``) with database time."""
        check_tenant(tenant_id)
        return _view(await self.store.request_cancellation(RunKey(tenant_id, _parse_run_id(run_id))))

    async def resolve_interrupt(self, tenant_id: str, run_id: uuid.UUID | str, wait_id: str, resolution: Any) -> bool:
        """Resolve an interrupt (see :meth:`resolve`); returns False for an exact duplicate resolution."""
        return await self.resolve(tenant_id, run_id, wait_id, resolution) is not ResolveOutcome.DUPLICATE

    async def resolve(self, tenant_id: str, run_id: uuid.UUID | str, wait_id: str, resolution: Any) -> ResolveOutcome:
        """Resolve interrupt ``wait_id`` of a run.

        ``RESOLVED``: the run waited on it and wakes. ``STORED_EARLY``: the run has not reached that wait yet
        and its graph declares the interrupt; the resolution is stored and consumed by the wait edge that
        registers it. ``DUPLICATE``: an exact repeat of the last resolution of that name. A name the graph does
        not declare raises InvalidInputError (field ``wait_id``); a run whose graph declares no interrupts
        raises NotFoundError unless it waits on that name.
        """
        check_tenant(tenant_id)
        if not isinstance(wait_id, str) or not wait_id:
            raise InvalidInputError("wait_id", "must be a non-empty string")
        try:
            value = json_clone(resolution)
        except ValueError as exc:
            raise InvalidInputError("resolution", str(exc)) from None
        return await self.store.resolve_interrupt(RunKey(tenant_id, _parse_run_id(run_id)), wait_id, value)
