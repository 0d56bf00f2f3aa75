"""E2B's snapshots and fork, on ADX checkpoints (docs/e2b.md "Snapshots and fork").

| E2B | ADX |
|---|---|
| ``POST /sandboxes/{id}/snapshots`` ``{name, memory}`` | a filesystem checkpoint of the running sandbox, captured
  while it goes on (frozen only for the capture), kept by the Coordinator apart from the sandbox |
| ``GET /snapshots`` (``sandboxID``, ``name``, ``limit``, ``nextToken``) | the tenant's snapshots, newest first |
| ``DELETE /templates/{id}`` | delete the snapshot; its artifact is retired and deleted by its node |
| ``POST /v2/sandboxes`` with the snapshot as ``templateID`` | an Environment whose first start restores it |
| ``POST /sandboxes/{id}/fork`` ``{timeout, count}`` | one snapshot, ``count`` sandboxes from it, then the
  snapshot is deleted |

A snapshot outlives its source sandbox and is kept for the source's pause retention (ENV-3: 25 hours from its
capture by default); E2B's memory snapshots (``memory: true``) are refused, since ADX checkpoints filesystems.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from adx.e2b._bodies import SandboxForkRequest, SandboxSnapshotRequest, body_of
from adx.e2b._control import (
    E2bRoute,
    _tenant,
    _visible,
    _wait_running,
    created_view,
    page_limit,
    paged,
)
from adx.e2b._run_files import start_run_files
from adx.e2b._snapshot_client import create_from_snapshot, create_snapshot, delete_snapshot, list_snapshots
from adx.errors import AdxError, InvalidInputError
from adx.gateway import Plane, plane, status_for
from adx.ingress import Ingress, serving_ingress
from adx.model import EnvironmentRecord, EnvironmentSpec, Snapshot

snapshot_router = APIRouter(include_in_schema=False, route_class=E2bRoute)
_log = logging.getLogger(__name__)


def snapshot_view(snapshot: Snapshot) -> dict[str, object]:
    return {"snapshotID": snapshot.id, "names": [snapshot.name] if snapshot.name else []}


@snapshot_router.post("/sandboxes/{sandbox_id}/snapshots")
async def create_snapshot_route(request: Request, sandbox_id: str) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    wanted = await body_of(request, SandboxSnapshotRequest, optional=True)
    if wanted.memory:
        raise InvalidInputError(
            "memory", "memory snapshots are not supported by this server: use mode='filesystem' (files are kept)"
        )
    record = await _visible(p, tenant, sandbox_id)
    snapshot = await create_snapshot(p, tenant, record.id, wanted.name or None)
    return JSONResponse(snapshot_view(snapshot), status_code=201)


@snapshot_router.get("/snapshots")
async def list_snapshots_route(request: Request) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    query = request.query_params
    limit = page_limit(query)
    name = query.get("name") or None
    found = [
        s
        for s in await list_snapshots(p, tenant, query.get("sandboxID") or None)
        if name is None or name in (s.id, s.name) or (s.name is not None and name.removesuffix(":latest") == s.name)
    ]
    found.sort(key=lambda s: (s.created_at, s.id), reverse=True)  # newest first, as E2B's sandbox list
    keys = [(s.created_at, s.id) for s in found]
    page, headers = paged(found, keys, query.get("nextToken"), limit, newest_first=True)
    return JSONResponse([snapshot_view(s) for s in page], headers=headers)


@snapshot_router.delete("/templates/{template_id:path}")
async def delete_snapshot_route(request: Request, template_id: str) -> Response:
    """The SDK deletes a snapshot as a template. Templates that are not snapshots (images) are not deleted
    through E2B's API: they answer the same 404 as a missing snapshot."""
    p = plane(request)
    tenant = await _tenant(request)
    await delete_snapshot(p, tenant, template_id)
    return Response(status_code=204)


@snapshot_router.post("/sandboxes/{sandbox_id}/fork")
async def fork_sandbox(request: Request, sandbox_id: str) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    wanted = await body_of(request, SandboxForkRequest, optional=True)
    source = await _visible(p, tenant, sandbox_id)
    snapshot = await create_snapshot(p, tenant, source.id, None)
    lifecycle = source.spec.lifecycle.model_copy(update={"lifetime_seconds": wanted.timeout})
    spec = source.spec.model_copy(update={"lifecycle": lifecycle})
    outcomes = await asyncio.gather(
        *(_fork_one(p, serving_ingress(request.app), tenant, snapshot, spec) for _ in range(wanted.count)),
        return_exceptions=True,
    )
    results: list[dict[str, object]] = []
    settled = True
    for outcome in outcomes:
        if isinstance(outcome, EnvironmentRecord):
            results.append({"sandbox": created_view(request, outcome)})
        elif isinstance(outcome, AdxError):
            settled = settled and not _may_still_start(outcome)
            status = 400 if status_for(outcome) == 422 else status_for(outcome)
            results.append({"error": {"code": status, "message": outcome.message}})
        elif isinstance(outcome, BaseException):
            settled = False
            _log.error("fork of %s failed", sandbox_id, exc_info=outcome)
            results.append({"error": {"code": 500, "message": f"internal error: {type(outcome).__name__}"}})
    if settled:
        # Every fork has restored the checkpoint (or never will): nothing needs the snapshot any more.
        with contextlib.suppress(AdxError):
            await delete_snapshot(p, tenant, snapshot.id)
    else:
        # A fork still starting reads the artifact: the snapshot stays until its retention ends.
        _log.warning("fork of %s: snapshot %s kept until it expires", sandbox_id, snapshot.id)
    return JSONResponse(results, status_code=201)


async def _fork_one(
    p: Plane, ingress: Ingress | None, tenant: str, snapshot: Snapshot, spec: EnvironmentSpec
) -> EnvironmentRecord:
    record = await _wait_running(p, await create_from_snapshot(p, tenant, snapshot.id, spec, None))
    start_run_files(ingress, record)  # the copied ones name the source
    return record


def _may_still_start(error: AdxError) -> bool:
    """A fork whose wait ended while it was still starting (or whose create's outcome is unknown)."""
    return status_for(error) in (503, 504) or "still" in error.message
