"""The E2B control plane (``X-API-KEY``): sandboxes are ADX Environments of the key's tenant, with the same IDs.

| E2B | ADX |
|---|---|
| ``POST /v2/sandboxes`` ``{templateID, timeout, autoPause, metadata, envVars}`` | create, wait until running, ready |
| ``GET /v2/sandboxes`` (``metadata``, ``state``, ``startedAfter``, ``template``, ``order``, ``limit``) | list |
| ``GET /sandboxes/{id}``, ``DELETE /sandboxes/{id}`` | get, delete |
| ``POST /sandboxes/{id}/timeout`` ``{timeout}`` | set the lifetime deadline (``set_lifetime``) |
| ``POST /sandboxes/{id}/pause`` | pause (409 when already paused) |
| ``POST /v2/sandboxes/{id}/connect`` | ``ensure_running`` (201 when it resumed) |
| ``GET /sandboxes/{id}/metrics`` | the node's last usage sample (``stats``); ``[]`` when not running (never wakes) |

The list is newest first unless ``order=asc``; ``nextToken`` pages (``x-next-token``). Errors are E2B's
``{"code": <HTTP status>, "message": "..."}``; another tenant's sandbox is a 404 like a missing
one (SEC-2). ``templateID`` is the image (``base``: the default one); ``timeout`` and ``autoPause`` become
``lifecycle.lifetimeSeconds`` and ``lifetimeAction``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from fastapi import APIRouter, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from adx.e2b._bodies import DEFAULT_TIMEOUT_SECONDS, ConnectSandbox, NewSandbox, SandboxTimeoutRequest, body_of
from adx.e2b._envd import tokens_for
from adx.e2b._hosts import base_domain, sandbox_domain
from adx.e2b._network import e2b_network_options, network_policy
from adx.e2b._process import sandbox_variables
from adx.e2b._run_files import run_files_written, start_run_files
from adx.e2b._snapshot_client import create_from_snapshot, get_snapshot
from adx.e2b._start_cmd import run_start_command, start_command_of
from adx.e2b._template_store import TemplateStore
from adx.e2b._template_tags import DEFAULT_TAG, SEPARATOR, parse_name, resolve_image
from adx.e2b._upstream import Execd
from adx.e2b._views import CreatedSandbox, SandboxLifecycle, SandboxMetric, SandboxState, SandboxView, wire
from adx.errors import AdxError, ConflictError, InvalidInputError, NoCapacityError, NotFoundError, UnavailableError
from adx.gateway import (
    ON_THE_WAY,
    Plane,
    check_volume_mounts,
    environment_id_or_404,
    plane,
    read_json,
    retry_after_seconds,
    status_for,
    wait_running,
)
from adx.ingress import serving_ingress
from adx.model import (
    SNAPSHOT,
    EnvironmentRecord,
    EnvironmentSpec,
    EnvironmentState,
    EnvironmentStats,
    IdleAction,
    parse_wire,
)

#: The envd version the SDK is told: the features it gates on that version are the ones served here.
ENVD_VERSION = "0.6.4"
DEFAULT_CPU_MILLIS = 500
DEFAULT_MEMORY_BYTES = 512 << 20
MAX_PAGE = 100
MiB = 1 << 20
_RUNNING = frozenset(
    {EnvironmentState.PENDING, EnvironmentState.STARTING, EnvironmentState.RUNNING, EnvironmentState.RESUMING}
)
_PAUSED = frozenset({EnvironmentState.PAUSING, EnvironmentState.PAUSED})
T = TypeVar("T")
_log = logging.getLogger(__name__)
#: The first path segments of E2B's API (its SDK's routes): anything under them that ADX does not serve still
#: answers E2B's error shape, so the SDK raises its own exception instead of failing to parse ADX's.
E2B_PREFIXES = ("sandboxes", "v2", "v3", "templates", "snapshots", "volumes", "secrets", "default-templates")
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class E2bRoute(APIRoute):
    """A route of E2B's API: its errors answer in E2B's shape ``{"code": status, "message"}`` (the SDK parses only
    that; ADX's own would crash it, KeyError). The routers of E2B's routes are made with it, so no route of them
    can answer otherwise."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except (HTTPException, RequestValidationError):  # FastAPI's own answers, not the route's errors
                raise
            except AdxError as exc:
                status = 400 if status_for(exc) == 422 else status_for(exc)
                # A 503 (no capacity, not admitting now) says when to ask again, as the native API does.
                headers = {"Retry-After": str(retry_after_seconds(exc))} if status in (503, 504) else None
                return JSONResponse({"code": status, "message": exc.message}, status_code=status, headers=headers)
            except Exception as exc:
                _log.exception("E2B control-plane call failed")
                return JSONResponse({"code": 500, "message": f"internal error: {type(exc).__name__}"}, status_code=500)

        return answer


router = APIRouter(include_in_schema=False, route_class=E2bRoute)


async def _tenant(request: Request) -> str:
    key = request.headers.get("x-api-key")
    return await plane(request).auth.tenant(f"Bearer {key}" if key else None)


def _cpu_count(cores: float) -> int:
    """E2B counts whole CPUs: the Environment's CPU limit rounded up, at least one."""
    return max(1, math.ceil(cores))


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def e2b_state(record: EnvironmentRecord) -> SandboxState | None:
    if record.state in _RUNNING:
        return "running"
    if record.state in _PAUSED:
        return "paused"
    return None  # deleting, deleted, failed: E2B knows no such sandbox


def sandbox_view(p: Plane, request: Request, record: EnvironmentRecord, *, detail: bool) -> dict[str, object]:
    resources = record.spec.resources
    expires = record.expires_at
    listed = SandboxView(
        template_id=record.spec.image,
        sandbox_id=record.id,
        client_id=record.node or "adx",
        started_at=_iso(record.created_at),
        # No deadline (an Environment made without one): E2B has no such state; a far end says so.
        end_at=_iso(expires if expires is not None else record.created_at + 100 * 365 * 86400),
        cpu_count=_cpu_count(resources.cpu_millis / 1000),
        memory_mb=resources.memory_bytes // MiB,
        disk_size_mb=resources.disk_bytes // MiB,
        state=e2b_state(record),
        envd_version=ENVD_VERSION,
        metadata=dict(record.spec.metadata),
        alias=record.spec.image,
    )
    if not detail:
        return wire(listed)
    pauses = record.spec.lifecycle.lifetime_action is IdleAction.PAUSE
    # Traffic wakes a paused sandbox unless the create said autoResume false (E2B allows it only where the
    # timeout pauses).
    wakes = record.spec.lifecycle.wake_on_traffic
    allow_internet_access, network = e2b_network_options(record.spec.network)
    detail_fields: dict[str, object] = {
        "envd_access_token": tokens_for(request.app).mint(record.tenant, record.id),
        "domain": _domain(p, request, record),
        "lifecycle": SandboxLifecycle(on_timeout="pause" if pauses else "kill", auto_resume=pauses and wakes),
        "allow_internet_access": allow_internet_access,
    }
    if network is not None:
        detail_fields["network"] = network
    return wire(listed.model_copy(update=detail_fields))  # the copy counts them as set: they are sent


def _domain(p: Plane, request: Request, record: EnvironmentRecord) -> str:
    """The sandbox's ``domain``: the SDK's ``get_host(port)`` is ``{port}-{id}.{domain}`` (adx.e2b._hosts)."""
    base = base_domain(p.config.e2b_domain, request.url.port)
    return sandbox_domain(tokens_for(request.app), record.tenant, record.id, base)


def created_view(request: Request, record: EnvironmentRecord) -> dict[str, object]:
    created = CreatedSandbox(
        template_id=record.spec.image,
        sandbox_id=record.id,
        client_id=record.node or "adx",
        envd_version=ENVD_VERSION,
        envd_access_token=tokens_for(request.app).mint(record.tenant, record.id),
        domain=_domain(plane(request), request, record),
    )
    return wire(created)


async def _visible(p: Plane, tenant: str, sandbox_id: str) -> EnvironmentRecord:
    """The sandbox as E2B sees it: gone (deleting, deleted, failed) is the same 404 as missing or foreign."""
    record = await p.coordinator.get_environment(tenant, environment_id_or_404(sandbox_id))
    if e2b_state(record) is None:
        raise NotFoundError(f"sandbox {sandbox_id} not found")
    return record


async def _wait_running(p: Plane, record: EnvironmentRecord) -> EnvironmentRecord:
    """E2B's create answers once the sandbox runs: woken by the commit's publication (``adx.gateway``'s wait),
    which also primes the route cache for the sandbox's first command."""
    seconds = p.config.start_wait_seconds
    record = await wait_running(p, record.tenant, record, seconds)
    if record.state in ON_THE_WAY:
        raise UnavailableError(f"sandbox {record.id} is still {record.state.value}; it may start shortly")
    if record.state is not EnvironmentState.RUNNING:
        raise ConflictError(f"sandbox {record.id} did not start: it is {record.state.value} ({record.last_error})")
    return record


async def _body(request: Request) -> dict[str, object]:
    """The request's JSON object, for the body read field by field (``update_network``); the others are the
    typed bodies of ``adx.e2b._bodies``."""
    body = await read_json(request, plane(request).config.max_body_bytes)
    if not isinstance(body, dict):
        raise InvalidInputError("body", "must be a JSON object")
    return body


@router.post("/v2/sandboxes")
async def create_sandbox(request: Request) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    body = await body_of(request, NewSandbox)
    for unsupported, given in (("mcp", body.mcp), ("iam", body.iam)):
        if given:
            raise InvalidInputError(unsupported, "is not supported by this server")
    template = body.template_id
    if template is None:
        raise InvalidInputError("templateID", "required")
    if SEPARATOR in template and not template.startswith(f"{SNAPSHOT}-"):
        # ``name:tag``: the image of the build the template's tag names (else a snapshot's name, below).
        template = await asyncio.to_thread(_tagged_image, p, template) or template
    network = network_policy(body.allow_internet_access, body.network)
    from_snapshot = await _is_snapshot(p, tenant, template)
    wire = {
        "network": network.model_dump(mode="json", by_alias=True, exclude_none=True),
        # From a snapshot the image is the snapshot's (the Coordinator sets it): the template names no image.
        "image": "base" if from_snapshot else template,
        "resources": {"cpuMillis": DEFAULT_CPU_MILLIS, "memoryBytes": DEFAULT_MEMORY_BYTES},
        "env": body.env_vars or {},
        "metadata": body.metadata or {},
        "lifecycle": {
            "lifetimeSeconds": body.timeout,
            "lifetimeAction": "pause" if body.auto_pause else "delete",
            "wakeOnTraffic": body.wakes,
        },
        "volumes": body.volume_mounts or [],
    }
    try:
        spec = parse_wire(EnvironmentSpec, wire)
    except InvalidInputError as exc:
        if not exc.field.startswith("volumes"):
            raise
        raise InvalidInputError("volumeMounts" + exc.field.removeprefix("volumes"), exc.reason) from None
    if spec.volumes:
        # The same rules as /v1 (absolute path, not /, /proc, /sys, /dev, each once), named as E2B names them.
        await check_volume_mounts(p, tenant, spec, field="volumeMounts")
    key = request.headers.get("idempotency-key") or None
    created = False  # a sandbox from a snapshot starts afresh on its files: no template start command
    if from_snapshot:
        record = await create_from_snapshot(p, tenant, template, spec, key)
    else:
        record, created = await _create_when_room(p, tenant, spec, key)
    record = await _wait_running(p, record)
    start_run_files(serving_ingress(request.app), record)
    if created:  # a retried create (the same idempotency key) finds it started already
        await _start_template_command(p, request, record)
    return JSONResponse(created_view(request, record), status_code=201)


async def _create_when_room(
    p: Plane, tenant: str, spec: EnvironmentSpec, key: str | None
) -> tuple[EnvironmentRecord, bool]:
    """The create, sent again while no node has room for it, up to ``e2b_capacity_wait_seconds``: E2B's SDK gives
    up at the first 503 (a burst of creates on a full node failed a third of them, bench_tti), so the wait the
    native SDK does on its side (``create(wait=SECONDS)``) happens here. A refused create left nothing behind, and
    each try waits the refusal's own retry hint, bounded by what is left; past the bound the 503 goes out."""
    deadline = time.monotonic() + p.config.e2b_capacity_wait_seconds
    while True:
        try:
            return await p.coordinator.create_environment(tenant, spec, key)
        except NoCapacityError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            await asyncio.sleep(min(left, float(exc.details.get("retry_after_seconds", 1.0))))


async def _start_template_command(p: Plane, request: Request, record: EnvironmentRecord) -> None:
    """A template's start command, launched, and its ready command, succeeded, before the create answers
    (adx.e2b._start_cmd); a sandbox that does not get ready is deleted and the create fails naming why."""
    images = p.config.images_dir
    if images is None:
        return
    from adx.images import ImageStore  # only where the API has an image store

    manifest = await asyncio.to_thread(ImageStore(images / "store").find, record.spec.image)
    command = start_command_of(manifest)
    if command is None:
        return
    ingress = serving_ingress(request.app)
    if ingress is None:
        raise UnavailableError(
            f"template {record.spec.image!r} has a start command, and this server has no data plane to run it"
            " (ingress = false)"
        )
    execd = Execd(ingress, record.tenant, record.id)
    await run_files_written(record.tenant, record.id)  # the start command may read them, as it may on E2B
    try:
        await run_start_command(
            execd, command, sandbox_variables(execd, record.spec.image), p.config.start_wait_seconds
        )
    except BaseException:
        with contextlib.suppress(AdxError):  # already going: the create's error is the one to report
            await p.coordinator.delete_environment(record.tenant, record.id)
        raise


def _tagged_image(p: Plane, template: str) -> str | None:
    """The image ``name:tag`` starts (adx.e2b._template_tags); None: no template has that tag."""
    if p.config.images_dir is None:
        return None
    try:
        name, tag = parse_name(template, "templateID")
        return resolve_image(TemplateStore(p.config.images_dir / "e2b-templates"), name, tag or DEFAULT_TAG)
    except (InvalidInputError, NotFoundError):
        return None


async def _is_snapshot(p: Plane, tenant: str, template: str) -> bool:
    """E2B starts a sandbox from a snapshot by naming it as the template: a snapshot ID (``snap-...``), or a
    snapshot's name where no image has that name (an image wins: the image store is asked first)."""
    if template.startswith(f"{SNAPSHOT}-"):
        return True
    try:
        p.check_image(template, "templateID")
    except InvalidInputError:
        try:
            await get_snapshot(p, tenant, template)
        except NotFoundError:
            # E2B's answer for a template it does not know: 404 "template '...' not found".
            raise NotFoundError(
                f"template '{template}' not found: templateID names no image or snapshot of the tenant by that name"
                " (adx image list shows the images)",
                details={"field": "templateID"},
            ) from None
        return True
    return False


@router.get("/v2/sandboxes")
async def list_sandboxes(request: Request) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    query = request.query_params
    wanted_metadata = dict(parse_qsl(query.get("metadata", ""), keep_blank_values=True))
    states = {s for part in query.getlist("state") for s in part.split(",") if s} or {"running", "paused"}
    limit = page_limit(query)
    order = query.get("order") or "desc"  # E2B lists newest first unless asked otherwise
    if order not in ("asc", "desc"):
        raise InvalidInputError("order", f"must be 'asc' or 'desc', got {order!r}")
    started_after = _instant_param(query.get("startedAfter"), "startedAfter")
    template = query.get("template") or None
    records = [
        r
        for r in await p.coordinator.list_environments(tenant)
        if e2b_state(r) in states
        and all(r.spec.metadata.get(k) == v for k, v in wanted_metadata.items())
        and (started_after is None or r.created_at >= started_after)
        and (template is None or r.spec.image == template)
    ]
    records.sort(key=lambda r: (r.created_at, r.id), reverse=order == "desc")
    keys = [(r.created_at, r.id) for r in records]
    page, headers = paged(records, keys, query.get("nextToken"), limit, newest_first=order == "desc")
    return JSONResponse([sandbox_view(p, request, r, detail=False) for r in page], headers=headers)


def page_limit(query: Mapping[str, str]) -> int:
    """``limit``: 1 to MAX_PAGE (more is read as MAX_PAGE, as E2B caps it)."""
    try:
        limit = min(int(query.get("limit", MAX_PAGE)), MAX_PAGE)
        if limit < 1:
            raise ValueError
    except ValueError:
        raise InvalidInputError("limit", f"must be an integer from 1 to {MAX_PAGE}") from None
    return limit


def paged(
    items: list[T], keys: list[tuple[float, str]], token: str | None, limit: int, *, newest_first: bool
) -> tuple[list[T], dict[str, str]]:
    """One page of ``items`` (sorted by ``keys``: creation time and ID) from the position ``token`` names, and the
    ``x-next-token`` header. A token is a position in the order (the next item's key), not an item: the pages go
    on when that item is gone meanwhile (as E2B's cursor); one that is no position is 400 "Invalid next token"."""
    start = 0
    if token:
        at = _position(token)
        start = next((i for i, key in enumerate(keys) if (key <= at if newest_first else key >= at)), len(keys))
    end = start + limit
    headers = {"x-next-token": f"{keys[end][0]!r}~{keys[end][1]}"} if end < len(items) else {}
    return items[start:end], headers


def _position(token: str) -> tuple[float, str]:
    when, _, item = token.partition("~")
    try:
        moment = float(when)
    except ValueError:
        moment = math.nan
    if not item or not math.isfinite(moment):
        raise InvalidInputError("nextToken", f"Invalid next token {token[:100]!r} (give the x-next-token answered)")
    return moment, item


def _instant_param(value: str | None, field: str) -> float | None:
    """An RFC 3339 time (the SDK sends ``datetime.isoformat()``, with its offset) as Unix seconds."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInputError(field, f"must be an RFC 3339 time, got {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # no offset: UTC, as the API's own times are
    return moment.timestamp()


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(request: Request, sandbox_id: str) -> Response:
    p = plane(request)
    record = await _visible(p, await _tenant(request), sandbox_id)
    return JSONResponse(sandbox_view(p, request, record, detail=True))


@router.delete("/sandboxes/{sandbox_id}")
async def kill_sandbox(request: Request, sandbox_id: str) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    record = await p.coordinator.get_environment(tenant, environment_id_or_404(sandbox_id))
    if record.state in (EnvironmentState.DELETING, EnvironmentState.DELETED):
        raise NotFoundError(f"sandbox {sandbox_id} not found")
    await p.coordinator.delete_environment(tenant, record.id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout")
async def set_timeout(request: Request, sandbox_id: str) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    timeout = (await body_of(request, SandboxTimeoutRequest)).timeout
    record = await _visible(p, tenant, sandbox_id)
    if timeout == 0:
        # E2B counts the timeout from now: 0 expires the sandbox at once, with its timeout action.
        await _expire_now(p, tenant, record)
    else:
        await _set_lifetime(p, tenant, record, timeout)
    return Response(status_code=204)


async def _expire_now(p: Plane, tenant: str, record: EnvironmentRecord) -> None:
    """What the lifetime deadline does when it passes (the Coordinator's deadlines start at 1 s): pause an
    autoPause sandbox (an already paused one stays so), delete any other."""
    if record.spec.lifecycle.lifetime_action is IdleAction.PAUSE:
        if record.state not in _PAUSED:
            with contextlib.suppress(ConflictError):  # paused meanwhile: the outcome asked for
                await p.coordinator.pause_environment(tenant, record.id)
        return
    await p.coordinator.delete_environment(tenant, record.id)


async def _set_lifetime(p: Plane, tenant: str, record: EnvironmentRecord, seconds: int) -> EnvironmentRecord:
    """The deadline becomes now + ``seconds``; its action (delete, or pause for autoPause) stays."""
    return await p.coordinator.set_lifetime(tenant, record.id, float(seconds))


@router.put("/sandboxes/{sandbox_id}/network")
async def update_network(request: Request, sandbox_id: str) -> Response:
    """``update_network``: the new options replace the sandbox's policy, applied in place by its node
    (docs/network.md; a sandbox made without egress gets it at its next start or resume)."""
    p = plane(request)
    tenant = await _tenant(request)
    body = await _body(request)
    network = network_policy(None, body, field="body")
    record = await _visible(p, tenant, sandbox_id)
    await p.coordinator.set_network(tenant, record.id, network)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause")
async def pause_sandbox(request: Request, sandbox_id: str) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    record = await _visible(p, tenant, sandbox_id)
    await p.coordinator.pause_environment(tenant, record.id)  # ConflictError (already paused): E2B's 409
    return Response(status_code=204)


@router.post("/v2/sandboxes/{sandbox_id}/connect")
@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/sandboxes/{sandbox_id}/resume")
async def connect_sandbox(request: Request, sandbox_id: str) -> Response:
    """EnsureRunning: 200 when it was running, 201 when it had to be resumed."""
    p = plane(request)
    tenant = await _tenant(request)
    raw = await request.body()
    timeout = (await body_of(request, ConnectSandbox)).timeout if raw.strip() else None
    record = await _visible(p, tenant, sandbox_id)
    resumed = record.state in _PAUSED
    if resumed:
        record = (await p.coordinator.ensure_running(tenant, record.id, p.config.wake_timeout_seconds)).record
    record = await _wait_running(p, record)
    if resumed:
        start_run_files(serving_ingress(request.app), record)
    if resumed and record.spec.lifecycle.lifetime_seconds is not None:
        # A resumed sandbox gets a fresh deadline (its old one may have been what paused it).
        record = await _set_lifetime(p, tenant, record, timeout or DEFAULT_TIMEOUT_SECONDS)
    elif timeout is not None and (record.expires_at is None or time.time() + timeout > record.expires_at):
        # Running: E2B only ever extends the deadline on connect.
        record = await _set_lifetime(p, tenant, record, timeout)
    return JSONResponse(created_view(request, record), status_code=201 if resumed else 200)


@router.get("/sandboxes/{sandbox_id}/metrics")
async def sandbox_metrics(request: Request, sandbox_id: str) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    window = [_unix_param(request, name) for name in ("start", "end")]
    record = await _visible(p, tenant, sandbox_id)
    try:
        usage = await p.environment_stats(tenant, record.id)
    except ConflictError:
        return JSONResponse([])  # a paused sandbox has no usage, and asking never wakes it
    start, end = window
    if (start is not None and usage.sampled_at < start) or (end is not None and usage.sampled_at > end + 1):
        return JSONResponse([])  # the one sample kept is outside the asked interval
    return JSONResponse([metric_view(usage)])


def _unix_param(request: Request, name: str) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    if not value.isdigit():
        raise InvalidInputError(name, f"must be a Unix time in whole seconds, got {value!r}")
    return int(value)


def metric_view(usage: EnvironmentStats) -> dict[str, object]:
    """One E2B metric entry; ``cpuUsedPct`` is relative to ``cpuCount`` (the limit rounded up to whole cores)."""
    cpu_count = _cpu_count(usage.cpu_limit_cores)
    used_cores = (usage.cpu_percent or 0.0) / 100.0 * (usage.cpu_limit_cores or cpu_count)
    metric = SandboxMetric(
        timestamp=_iso(usage.sampled_at),
        timestamp_unix=int(usage.sampled_at),
        cpu_count=cpu_count,
        cpu_used_pct=round(100.0 * used_cores / cpu_count, 2),
        mem_used=usage.memory_bytes - usage.memory_cache_bytes,
        mem_total=usage.memory_limit_bytes,
        mem_cache=usage.memory_cache_bytes,
        disk_used=usage.disk_bytes,
        disk_total=usage.disk_limit_bytes,
    )
    return wire(metric)


async def not_served(request: Request) -> Response:
    """Routes of E2B's API this server does not serve (or a served path with another method): 501, since a 404
    on a sandbox's sub-route would make the SDK report the sandbox itself missing."""
    message = f"{request.method} {request.url.path} is not served by this ADX server (docs/e2b.md lists what is)"
    return JSONResponse({"code": 501, "message": message}, status_code=501)


# Registered last, and the router is included after ADX's own: these never shadow a served route.
for _prefix in E2B_PREFIXES:
    router.add_api_route(f"/{_prefix}", not_served, methods=_METHODS)
    router.add_api_route(f"/{_prefix}/{{rest:path}}", not_served, methods=_METHODS)
