"""Durable agent runs over HTTP: list, get, children, history, cancel, resolve, retry (``/v1/agent-runs``).

Tenant-authenticated like every ``/v1`` route: the API key names the tenant, and a run of another tenant is
the same 404 as a missing one (SEC-2). The API server reads the agent store's PostgreSQL URL from
``ADX_AGENT_DATABASE_URL`` and opens its pool on first use; without it these routes answer 503. Submission
needs a graph registry and stays in Python (``AgentRuns.submit``); nothing here starts a worker (AGT-13).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Concatenate, ParamSpec, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from adx.agents._canonical import JsonObject
from adx.errors import InvalidInputError, NotFoundError, UnavailableError
from adx.gateway import Credentials, OpenApiResponses, error_answer

if TYPE_CHECKING:
    from adx.agents import AgentResult, AgentRuns, AgentStore, RunEvent, RunView

__all__ = ["close_agent_store", "router"]

DATABASE_ENV = "ADX_AGENT_DATABASE_URL"
P = ParamSpec("P")
T = TypeVar("T")

ERRORS: OpenApiResponses = {
    401: error_answer("missing or unknown API key"),
    404: error_answer("no such run for this tenant"),
    409: error_answer("the run's state does not allow this (e.g. retry of a run not failed)"),
    422: error_answer("invalid input; details.field names it"),
    503: error_answer("the agent store is not configured or unavailable"),
}


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


STATUSES = ("queued", "running", "waiting", "succeeded", "failed", "cancelled")


class AgentWaitView(_Wire):
    wait_id: str
    kind: str = Field(description="interrupt, timer or join")
    payload: Any = None
    registered_at: datetime
    due_at: datetime | None = None
    resolved: bool


class AgentUsage(_Wire):
    input_tokens: int
    output_tokens: int
    model_calls: int
    tool_calls: int
    node_commits: int


class AgentResultView(_Wire):
    status: str = Field(description="succeeded, failed or cancelled")
    artifact: Any = Field(default=None, description="the graph's output (succeeded)")
    failure: JsonObject | None = Field(default=None, description="why the run failed")
    created_at: datetime


class AgentRunView(_Wire):
    run_id: uuid.UUID
    graph: str
    graph_version: str
    status: str = Field(description="queued, running, waiting, succeeded, failed or cancelled")
    checkpoint_seq: int
    fence: int
    leased: bool
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    usage: AgentUsage
    waits: list[AgentWaitView] = Field(default_factory=list, description="pending waits (status waiting)")
    result: AgentResultView | None = Field(default=None, description="once finished (GET of one run)")
    parent_run_id: uuid.UUID | None = Field(default=None, description="the run that spawned this one (a child)")
    children: int = Field(default=0, description="child runs this run spawned (GET /v1/agent-runs/{id}/children)")
    children_settled: bool = Field(
        default=False, description="finished, and so are all its children (set by the maintenance role)"
    )


class AgentRunList(_Wire):
    runs: list[AgentRunView]
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next (older) page")


class AgentRunChildren(_Wire):
    runs: list[AgentRunView] = Field(description="the run's children, oldest first")
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next page")


class AgentRunEventView(_Wire):
    id: uuid.UUID
    kind: str = Field(description="node_committed, waiting, released, succeeded, failed, cancelled, retried, ...")
    fence: int | None = None
    checkpoint_seq: int
    created_at: datetime
    node: str | None = None


class AgentRunHistory(_Wire):
    events: list[AgentRunEventView]


class ResolveRequest(_Wire):
    resolution: Any = Field(default=True, description="any JSON value; the node reads it from ctx.wake")


class ResolveResponse(_Wire):
    outcome: str = Field(description="resolved, stored_early (used when the run reaches the wait) or duplicate")
    run: AgentRunView


def _view(view: RunView, result: AgentResult | None = None) -> AgentRunView:
    """The run as the API shows it: the read models' fields by name (their enums as the values)."""
    shown = AgentRunView.model_validate(view, from_attributes=True)
    if result is None:
        return shown
    return shown.model_copy(update={"result": AgentResultView.model_validate(result, from_attributes=True)})


class _Stores:
    """One pool per application, opened on first use (the API server may run without any agent store)."""

    def __init__(self) -> None:
        self.store: AgentStore | None = None
        self.lock = asyncio.Lock()


def _stores(app: FastAPI) -> _Stores:
    holder = getattr(app.state, "agent_stores", None)
    if holder is None:
        holder = _Stores()
        app.state.agent_stores = holder
    return holder


def _database_url(request: Request) -> str | None:
    from adx.gateway import plane

    return plane(request).config.agent_database_url or os.environ.get(DATABASE_ENV)


async def _runs(request: Request) -> AgentRuns:
    from adx.agents import AgentRuns, AgentStore

    holder = _stores(request.app)
    async with holder.lock:
        if holder.store is None:
            url = _database_url(request)
            if not url:
                raise UnavailableError(
                    "agent runs are not configured on this API server "
                    f"(set agent_database_url in its configuration, or {DATABASE_ENV})"
                )
            holder.store = await AgentStore.open(url, min_size=1, max_size=4, migrate=False, timeout=10)
    return AgentRuns(holder.store)


async def close_agent_store(app: FastAPI) -> None:
    holder = getattr(app.state, "agent_stores", None)
    if holder is not None and holder.store is not None:
        await holder.store.close()
        holder.store = None


async def _tenant(request: Request, credentials: Credentials) -> str:
    from adx.agents._pg import check_tenant
    from adx.gateway import plane

    tenant = await plane(request).tenant(credentials)
    try:
        return check_tenant(tenant)
    except InvalidInputError:
        raise NotFoundError("this tenant has no agent runs") from None


def _run_id(run_id: str) -> uuid.UUID:
    """A malformed ID names no run: the same 404 as a missing or foreign one (SEC-2)."""
    try:
        return uuid.UUID(run_id)
    except ValueError:
        raise NotFoundError(f"run {run_id[:80]} not found") from None


@dataclass(frozen=True)
class _RunRef:
    """The run a request names, of the tenant its key names, and the store to reach it through."""

    runs: AgentRuns
    tenant: str
    key: uuid.UUID

    async def do(
        self, op: Callable[Concatenate[str, uuid.UUID, P], Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``op(tenant, key, ...)``: a missing run, or another tenant's, is the one 404 (SEC-2)."""
        try:
            return await op(self.tenant, self.key, *args, **kwargs)
        except NotFoundError:
            raise NotFoundError(f"run {self.key} not found") from None

    async def view(self) -> AgentRunView:
        """The run as the API shows it, with its result once it finished."""
        view = await self.do(self.runs.get_run)
        return _view(view, await self.runs.get_result(self.tenant, self.key) if view.finished else None)


async def _ref(request: Request, credentials: Credentials, run_id: str) -> _RunRef:
    """Checked in this order: the key (401), the run ID (a malformed one: 404), then the store (503)."""
    tenant = await _tenant(request, credentials)
    key = _run_id(run_id)
    return _RunRef(await _runs(request), tenant, key)


#: :func:`_ref` as the dependency of a route with no parameter of its own besides ``{run_id}`` (FastAPI solves it
#: before it validates a route's own parameters: a route with some calls ``_ref`` itself, so they are a 422 first).
Run = Annotated[_RunRef, Depends(_ref)]


router = APIRouter(prefix="/v1/agent-runs", tags=["agent runs"], responses=ERRORS)


@router.get("", response_model=AgentRunList, summary="List runs, newest first")
async def list_agent_runs(
    request: Request,
    credentials: Credentials,
    status: Annotated[str | None, Query(description=", ".join(STATUSES))] = None,
    graph: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> AgentRunList:
    tenant = await _tenant(request, credentials)
    page = await (await _runs(request)).list_runs(tenant, status=status, graph=graph, limit=limit, cursor=cursor)
    return AgentRunList(runs=[_view(v) for v in page.runs], next_cursor=page.next_cursor)


@router.get("/{run_id}", response_model=AgentRunView, summary="Get a run")
async def get_agent_run(ref: Run) -> AgentRunView:
    return await ref.view()


@router.get("/{run_id}/children", response_model=AgentRunChildren, summary="The child runs a run spawned, oldest first")
async def agent_run_children(
    request: Request,
    run_id: str,
    credentials: Credentials,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> AgentRunChildren:
    ref = await _ref(request, credentials, run_id)
    page = await ref.do(ref.runs.children, limit=limit, cursor=cursor)
    return AgentRunChildren(runs=[_view(v) for v in page.runs], next_cursor=page.next_cursor)


@router.get("/{run_id}/history", response_model=AgentRunHistory, summary="A run's journal")
async def agent_run_history(ref: Run) -> AgentRunHistory:
    events = await ref.do(ref.runs.history)
    return AgentRunHistory(events=[_event(e) for e in events])


def _event(event: RunEvent) -> AgentRunEventView:
    """A journal entry as the API shows it: its fields by name, and the node a commit names (in its payload)."""
    node = event.payload.get("node") if isinstance(event.payload, dict) else None
    return AgentRunEventView.model_validate(event, from_attributes=True).model_copy(update={"node": node})


@router.post("/{run_id}/cancel", response_model=AgentRunView, summary="Request cancellation")
async def cancel_agent_run(ref: Run) -> AgentRunView:
    await ref.do(ref.runs.request_cancellation)
    return await ref.view()


@router.post(
    "/{run_id}/interrupts/{wait_id}/resolve",
    response_model=ResolveResponse,
    summary="Resolve an interrupt (an approval), also before the run reaches it when its graph declares it",
)
async def resolve_agent_interrupt(
    request: Request, run_id: str, wait_id: str, body: ResolveRequest, credentials: Credentials
) -> ResolveResponse:
    ref = await _ref(request, credentials, run_id)
    await ref.do(ref.runs.get_run)
    outcome = await ref.runs.resolve(ref.tenant, ref.key, wait_id, body.resolution)
    return ResolveResponse(outcome=outcome.value, run=await ref.view())


@router.post(
    "/{run_id}/retry",
    response_model=AgentRunView,
    summary="Go on with a failed run from the last checkpoint before its failure",
)
async def retry_agent_run(ref: Run) -> AgentRunView:
    await ref.do(ref.runs.retry)
    return await ref.view()


class ForkRequest(_Wire):
    checkpoint_seq: int = Field(ge=0, description="the checkpoint of the run to start from (see its history)")


@router.post(
    "/{run_id}/fork",
    response_model=AgentRunView,
    status_code=201,
    summary="Start a new run from a chosen checkpoint of a run (the run itself is unchanged)",
)
async def fork_agent_run(request: Request, run_id: str, body: ForkRequest, credentials: Credentials) -> AgentRunView:
    ref = await _ref(request, credentials, run_id)
    await ref.do(ref.runs.get_run)
    return _view(await ref.runs.fork(ref.tenant, ref.key, body.checkpoint_seq))
