"""``GET /v1/environments/{id}/logs``: an Environment's workload output (stdout and stderr of its entrypoint),
from the node that keeps it. Follow = read again with the returned cursor and ``waitSeconds``: each answer
returns as soon as a new line exists (long poll), so a client follows with plain requests and resumes after a
dropped connection without losing or repeating lines."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from adx.errors import ConflictError, EnvironmentPausedError
from adx.gateway import ERRORS, Credentials, error_answer, tenant_environment
from adx.model import DORMANT_STATES, MAX_LOG_LINES, MAX_LOG_WAIT_SECONDS, EnvironmentLogs, EnvironmentState

__all__ = ["logs_router"]

logs_router = APIRouter(tags=["environments"])

#: Environments whose node no longer keeps output (it is reclaimed with the Environment, MET-5).
_NO_LOGS = frozenset({EnvironmentState.DELETED, EnvironmentState.DELETING})


@logs_router.get(
    "/v1/environments/{environment_id}/logs",
    response_model=EnvironmentLogs,
    responses={
        **ERRORS,
        409: error_answer("no node keeps its output now (e.g. paused on a node that left)"),
    },
    summary="The workload's stdout and stderr (every execution: restarts continue the log); never wakes it",
)
async def environment_logs(
    request: Request,
    environment_id: str,
    credentials: Credentials,
    tail: Annotated[int | None, Query(ge=0, le=MAX_LOG_LINES, description="without cursor: the last N lines")] = None,
    since: Annotated[datetime | None, Query(description="RFC 3339: only lines read at or after this time")] = None,
    cursor: Annotated[str | None, Query(max_length=256, description="from an earlier answer: only newer lines")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LOG_LINES, description="at most this many lines")] = 1000,
    wait_seconds: Annotated[
        float,
        Query(alias="waitSeconds", ge=0, le=MAX_LOG_WAIT_SECONDS, description="wait this long for a new line"),
    ] = 0.0,
) -> JSONResponse:
    t = await tenant_environment(request, credentials, environment_id)
    p, tenant, env_id = t.plane, t.tenant, t.env_id
    route = await p.coordinator.resolve_route(tenant, env_id)
    state = route.record.state
    if not route.node_address or p.nodes is None or state in _NO_LOGS:
        error = EnvironmentPausedError if state in DORMANT_STATES else ConflictError
        raise error(
            f"environment {env_id} is {state.value} and no node keeps its output now (logs stay with the node "
            "that runs or holds it, and go with the Environment)",
            details={"state": state.value},
        )
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)  # a time without a zone is UTC
    logs = await p.nodes.logs(
        route.node_address,
        tenant,
        env_id,
        cursor=cursor or "",
        tail=tail,
        since=since.astimezone(UTC).isoformat() if since is not None else "",
        limit=limit,
        wait_seconds=wait_seconds,
    )
    return JSONResponse(logs.to_wire())
