"""The public REST API (``adx api``): Environments create/get/list/delete, tenant-scoped, OpenAPI at /openapi.json.

Every route authenticates first (``Authorization: Bearer <API key>``), then asks the Coordinator on behalf of
that tenant only; the Coordinator is the single authority, the API server keeps no state beyond short caches.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from adx.errors import (
    AdxError,
    InvalidInputError,
    PublicationPendingError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.gateway import (
    ERRORS,
    MAX_WAIT_SECONDS,
    ON_THE_WAY,
    Credentials,
    TenantEnv,
    check_volume_mounts,
    error_answer,
    json_body,
    plane,
    read_json,
    tenant_environment,
    wait_running,
    wait_timeout,
)
from adx.model import (
    EnvironmentList,
    EnvironmentRecord,
    EnvironmentSpec,
    EnvironmentState,
    EnvironmentStats,
    EnvironmentView,
    NetworkPolicy,
    WholeNumber,
    parse_wire,
)

log = logging.getLogger("adx.api")

MAX_IDEMPOTENCY_KEY = 255


def _idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not 0 < len(value) <= MAX_IDEMPOTENCY_KEY or not all(33 <= ord(c) <= 126 for c in value):
        raise InvalidInputError("Idempotency-Key", f"must be 1-{MAX_IDEMPOTENCY_KEY} visible ASCII characters")
    return value


router = APIRouter(tags=["environments"], responses=ERRORS)

#: How long ``?wait=running`` waits when ``waitSeconds`` is not given.
DEFAULT_WAIT_SECONDS = 30.0
WaitFor = Annotated[
    Literal["running"] | None,
    Query(
        description="answer once the Environment is no longer on its way to running (pending, starting, "
        "resuming): when it is running, or failed or deleted; woken by the commit's publication, not a poll"
    ),
]
WaitSeconds = Annotated[
    float | None,
    Query(
        alias="waitSeconds",
        gt=0,
        le=MAX_WAIT_SECONDS,
        description=f"wait at most this long for running (default {DEFAULT_WAIT_SECONDS:g} with wait=running; "
        "given alone it implies wait=running, the only state there is to wait for)",
    ),
]


def _answer(record: EnvironmentRecord) -> JSONResponse:
    """A lifecycle route's answer: the Environment as its tenant sees it."""
    return JSONResponse(EnvironmentView.of(record).wire())


def _wait_seconds(wait: str | None, seconds: float | None) -> float | None:
    """How long a request asked to wait for running (None: no wait). ``waitSeconds`` alone asks for the one wait
    there is: refusing it would refuse a request its published schema allows."""
    if wait is None and seconds is None:
        return None
    return DEFAULT_WAIT_SECONDS if seconds is None else seconds


@router.post(
    "/v1/environments",
    status_code=201,
    response_model=EnvironmentView,
    responses={200: {"model": EnvironmentView, "description": "replay: the Idempotency-Key matched"}},
    openapi_extra=json_body(EnvironmentSpec),
    summary="Create an Environment (wait=running: answer once it runs, or as it is after waitSeconds)",
)
async def create_environment(
    request: Request,
    credentials: Credentials,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="a retry with the same key returns the same Environment",
            json_schema_extra={"pattern": f"^[!-~]{{1,{MAX_IDEMPOTENCY_KEY}}}$"},
        ),
    ] = None,
    wait: WaitFor = None,
    wait_seconds: WaitSeconds = None,
) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    key = _idempotency_key(idempotency_key)
    seconds = _wait_seconds(wait, wait_seconds)
    # ENV-5: the whole spec is validated here, before anything is sent anywhere; 422 names the field.
    spec = parse_wire(EnvironmentSpec, await read_json(request, p.config.max_body_bytes))
    p.check_image(spec.image, "image")
    await check_volume_mounts(p, tenant, spec)
    record, created = await p.coordinator.create_environment(tenant, spec, key)
    log.info("environment created" if created else "create replayed", extra={"env_id": record.id, "tenant": tenant})
    if seconds is not None:
        # The create is done whatever the wait brings: a wait that ends first answers the Environment as it is
        # (still pending or starting), and GET ...?wait=running goes on waiting. A wait that fails (the
        # Coordinator unreachable meanwhile) answers the same: a 503 would say nothing was created.
        try:
            record = await wait_running(p, tenant, record, seconds)
        except AdxError as exc:
            log.warning("wait for running after a create ended: %s", exc, extra={"env_id": record.id})
    return JSONResponse(
        EnvironmentView.of(record).wire(),
        status_code=201 if created else 200,
        headers={"Location": f"/v1/environments/{record.id}", "Idempotent-Replayed": str(not created).lower()},
    )


@router.get("/v1/environments", response_model=EnvironmentList, summary="List Environments")
async def list_environments(request: Request, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    records = await p.coordinator.list_environments(tenant)
    records.sort(key=lambda r: (r.created_at, r.id))
    return JSONResponse({"environments": [EnvironmentView.of(r).wire() for r in records]})


@router.get(
    "/v1/environments/{environment_id}",
    response_model=EnvironmentView,
    responses={
        503: error_answer(
            "wait=running: still on its way after waitSeconds (code wait_timeout, details.state); "
            "or the Coordinator is unavailable"
        ),
    },
    summary="Get one (wait=running: a long poll until it runs)",
)
async def get_environment(
    request: Request,
    environment_id: str,
    credentials: Credentials,
    wait: WaitFor = None,
    wait_seconds: WaitSeconds = None,
) -> JSONResponse:
    t = await tenant_environment(request, credentials, environment_id)
    p, tenant, env_id = t.plane, t.tenant, t.env_id
    seconds = _wait_seconds(wait, wait_seconds)
    if seconds is not None:
        record = await wait_running(p, tenant, await p.coordinator.get_environment(tenant, env_id), seconds)
        if record.state in ON_THE_WAY:
            raise wait_timeout(record, seconds)
        return _answer(record)
    try:
        record = await p.coordinator.get_environment(tenant, env_id)
    except (UnavailableError, UncertainOutcomeError):
        # JRN-4/ENV-6: while the Coordinator is away, the owning node says what it holds, and whether a result
        # of it waits for publication; without a cached route the outage is the answer.
        view = await p.node_view(tenant, env_id)
        if view is None:
            raise
        body = EnvironmentView.of(view.record, publication_pending=view.publication_pending).wire()
        return JSONResponse(body, headers={"X-ADX-Answered-By": "node"})
    return _answer(record)


@router.delete(
    "/v1/environments/{environment_id}",
    response_model=EnvironmentView,
    summary="Delete (state becomes deleting, then deleted; repeating it is harmless)",
)
async def delete_environment(t: TenantEnv) -> JSONResponse:
    record = await t.plane.coordinator.delete_environment(t.tenant, t.env_id)
    log.info("environment delete requested", extra={"env_id": record.id, "tenant": t.tenant})
    return _answer(record)


@router.post(
    "/v1/environments/{environment_id}/pause",
    response_model=EnvironmentView,
    responses={409: error_answer("not running (e.g. already paused)")},
    summary="Pause: checkpoint, publish, release resources; returns once paused (ENV-3)",
)
async def pause_environment(t: TenantEnv) -> JSONResponse:
    p, tenant, env_id = t.plane, t.tenant, t.env_id
    route = await p.owner_route(tenant, env_id)
    record = route.record
    if record.state is EnvironmentState.RUNNING and route.node_address and p.nodes is not None:
        # CRD-1: a node operation goes straight to the owning node; the node checks ownership and generation.
        wait = record.spec.lifecycle.effective_pause_options.wait_seconds
        try:
            record = await p.nodes.pause(route.node_address, record, wait_seconds=wait)
        except PublicationPendingError:
            raise  # the cluster still routes it to this node (JRN-4): the cached route stays
        except BaseException:
            p.forget_route(tenant, env_id)  # changing: the next request resolves it afresh
            raise
        p.forget_route(tenant, env_id)  # paused: the next request resolves it afresh
    else:
        # Not running here (or no node): the Coordinator answers with the authoritative state and reason.
        record = await p.coordinator.pause_environment(tenant, env_id)
    log.info("environment paused", extra={"env_id": record.id, "tenant": tenant})
    return _answer(record)


@router.get(
    "/v1/environments/{environment_id}/stats",
    response_model=EnvironmentStats,
    responses={409: error_answer("not running (a paused one is not woken)")},
    summary="CPU, memory and disk usage of a running Environment, from its node's last sample (MET-1)",
)
async def environment_stats(t: TenantEnv) -> JSONResponse:
    return JSONResponse((await t.plane.environment_stats(t.tenant, t.env_id)).to_wire())


@router.post(
    "/v1/environments/{environment_id}/resume",
    response_model=EnvironmentView,
    responses={409: error_answer("neither paused nor running")},
    summary="Resume a paused Environment (a running one is returned as it is); returns once running (CRD-5)",
)
async def resume_environment(t: TenantEnv) -> JSONResponse:
    route = await t.plane.coordinator.ensure_running(t.tenant, t.env_id, t.plane.config.wake_timeout_seconds)
    return _answer(route.record)


class LifetimeRequest(BaseModel):
    """The new lifetime deadline of a running Environment."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    seconds: WholeNumber = Field(ge=1, le=30 * 86_400, description="the new deadline is now + seconds")
    action: Literal["delete", "pause"] | None = Field(default=None, description="default: keep the current one")


@router.post(
    "/v1/environments/{environment_id}/lifetime",
    response_model=EnvironmentView,
    responses={409: error_answer("not running or paused (e.g. deleted)")},
    openapi_extra=json_body(LifetimeRequest),
    summary="Move the lifetime deadline (and optionally its action: delete or pause)",
)
async def set_lifetime(request: Request, t: TenantEnv) -> JSONResponse:
    body = parse_wire(LifetimeRequest, await read_json(request, t.plane.config.max_body_bytes))
    return _answer(await t.plane.coordinator.set_lifetime(t.tenant, t.env_id, float(body.seconds), body.action or ""))


@router.post(
    "/v1/environments/{environment_id}/network",
    response_model=EnvironmentView,
    responses={409: error_answer("its state does not allow a change (e.g. deleted)")},
    openapi_extra=json_body(NetworkPolicy),
    summary="Replace the network policy (none, or egress with allow/deny lists); applied without a restart",
)
async def set_network(request: Request, t: TenantEnv) -> JSONResponse:
    body = parse_wire(NetworkPolicy, await read_json(request, t.plane.config.max_body_bytes), root="network")
    return _answer(await t.plane.coordinator.set_network(t.tenant, t.env_id, body))
