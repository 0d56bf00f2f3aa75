"""E2B template builds on ADX images (docs/e2b.md "Templates"): ``Template.build(...)`` of the ``e2b`` SDK.

- ``POST /v3/templates`` ``{name, cpuCount, memoryMB}``: a template named like the image it builds, and a build
  (``waiting``); 202 ``{templateID, buildID, ...}``.
- ``GET /templates/{id}/files/{hash}`` (one per COPY step): 201 ``{present, url}``, ``url`` a signed upload URL of
  this server; ``PUT`` there the tar(.gz) of the files: kept by its own sha256, unpacked for the build.
- ``POST /v2/templates/{id}/builds/{buildID}`` ``{fromImage, steps, startCmd, readyCmd}``: the steps mapped onto
  the image builder (adx.e2b._template_steps), checked, then run in the background (adx.e2b._template_build): 202.
- ``GET /templates/{id}/builds/{buildID}/status?logsOffset=``: ``waiting``/``building``/``ready``/``error``, E2B
  log entries from the offset, and a failure's reason and step (the SDK's wait polls it).
- ``GET /templates/aliases/{name}`` (``Template.exists``): 200 for a template of the tenant or an image any tenant
  may start, 403 for another tenant's template, else 404.
- ``DELETE /templates/{id}``: a template of the tenant loses its image and record; any other ID is a snapshot's
  (the SDK deletes snapshots as templates, adx.e2b._snapshots).

The template ID is its name: ``Sandbox.create(template=name)`` starts a sandbox on the image of the build its
``default`` tag names; tags and the catalog routes are adx.e2b._template_tags and adx.e2b._template_catalog.
Builds need ``images_dir`` and ``image_build_socket`` in the API's configuration (``adx up`` sets both); without
them these routes answer 501.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import os
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from adx.e2b._bodies import TemplateBuildRequestV3, body_of
from adx.e2b._control import E2bRoute, _tenant
from adx.e2b._envd import tokens_for
from adx.e2b._snapshot_client import delete_snapshot
from adx.e2b._template_build import DEFAULT_STEP_MEMORY_BYTES, BuildJob, TemplateBuilder
from adx.e2b._template_steps import BuildStart, base_image, to_instructions
from adx.e2b._template_store import (
    MAX_UPLOAD_BYTES,
    BuildReason,
    BuildRecord,
    BuildStatus,
    LogEntry,
    TemplateRecord,
    TemplateStore,
    owner_is_gone,
    process_owner,
)
from adx.e2b._template_tags import (
    DEFAULT_TAG,
    assign,
    build_image,
    check_name_length,
    normalize_tags,
    parse_name,
)
from adx.e2b._views import BuildLogEntry, BuildStatusReason, TemplateBuildInfo, wire
from adx.errors import AdxError, ConflictError, ForbiddenError, InvalidInputError, NotFoundError
from adx.gateway import plane
from adx.images import ImageStore
from adx.model import NODE_IMAGES

__all__ = ["template_router"]

template_router = APIRouter(include_in_schema=False, route_class=E2bRoute)
P = ParamSpec("P")
#: ``logsOffset`` pages hold at most this many entries (E2B's status route answers 100 at most).
MAX_LOG_PAGE = 100
_HASH = re.compile(r"^[0-9a-f]{64}$")
_UPLOAD_PURPOSE = "e2b-template-upload"


class _NotConfigured(Exception):
    pass


def template_route(fn: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
    """501 where this API server runs no template builds (caught before :class:`E2bRoute` would make any other
    exception a 500)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response:
        try:
            return await fn(*args, **kwargs)
        except _NotConfigured as exc:
            return JSONResponse({"code": 501, "message": str(exc)}, status_code=501)

    return wrapper


def _builder(request: Request, *, build: bool = True) -> TemplateBuilder:
    app = request.app
    found = getattr(app.state, "e2b_templates", None)
    if isinstance(found, TemplateBuilder):
        return found
    config = plane(request).config
    if config.images_dir is None or (build and config.image_build_socket is None):
        raise _NotConfigured(
            "template builds are not served by this ADX server: set images_dir and image_build_socket in api.toml"
        )
    root = config.images_dir / "e2b-templates"
    templates = TemplateStore(root)
    socket = config.image_build_socket or Path("/nonexistent")
    builder = TemplateBuilder(templates, ImageStore(config.images_dir / "store"), socket, templates.contexts)
    if config.image_build_socket is not None:
        app.state.e2b_templates = builder
    return builder


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _name_and_tags(body: TemplateBuildRequestV3) -> tuple[str, list[str]]:
    """The template's name and the tags its build gets: ``name:tag`` first, then ``tags``; none: ``default``."""
    given, field = (body.name, "name") if body.name else (body.alias, "alias")
    if not given:
        raise InvalidInputError("name", "required")
    name, tag = parse_name(given, field)
    check_name_length(name, field)
    tags = normalize_tags([*([tag] if tag else []), *(body.tags or [])], "tags")
    return name, tags or [DEFAULT_TAG]


def _in_progress(templates: TemplateStore, record: TemplateRecord) -> bool:
    if not record.builds:
        return False
    try:
        last = templates.get_build(record.builds[-1])
    except NotFoundError:
        return False
    return last.status in (BuildStatus.WAITING, BuildStatus.BUILDING) and not owner_is_gone(last.owner)


@template_router.post("/v3/templates")
@template_route
async def request_build(request: Request) -> Response:
    tenant = await _tenant(request)
    builder = _builder(request)
    body = await body_of(request, TemplateBuildRequestV3)
    name, tags = _name_and_tags(body)
    build = await asyncio.to_thread(_new_build, builder, tenant, name, tags, body)
    view = {"templateID": name, "buildID": build.id, "public": False, "names": [name], "tags": tags, "aliases": [name]}
    return JSONResponse(view, status_code=202)


def _new_build(
    builder: TemplateBuilder, tenant: str, name: str, tags: list[str], body: TemplateBuildRequestV3
) -> BuildRecord:
    with builder.templates.locked():
        return _new_build_locked(builder, tenant, name, tags, body.cpu_count, body.memory_mb)


def _new_build_locked(
    builder: TemplateBuilder, tenant: str, name: str, tags: list[str], cpu_count: int | None, memory_mb: int | None
) -> BuildRecord:
    templates = builder.templates
    templates.sweep_staging()  # uploads and unpackings a crash left (cheap: a glob of two directories)
    record = templates.find_template(name)
    if record is None:
        if builder.images.find(name) is not None or name in NODE_IMAGES:
            raise ConflictError(f"{name!r} is an image not built from an E2B template: choose another name")
        record = TemplateRecord(name=name, tenant=tenant, created_at=time.time())
    elif record.tenant != tenant:
        raise ConflictError(f"the template name {name!r} is taken")
    elif _in_progress(templates, record):
        raise ConflictError(f"a build of template {name!r} is in progress")
    build_id = str(uuid.uuid4())
    build = BuildRecord(
        id=build_id,
        template=name,
        tenant=tenant,
        created_at=time.time(),
        owner=process_owner(),
        tags=tags,
        image=build_image(name, build_id),
    )
    templates.put_build(build)
    record.builds.append(build.id)
    record.cpu_count, record.memory_mb = cpu_count, memory_mb
    templates.put_template(record)
    return build


async def _own_template(builder: TemplateBuilder, tenant: str, template_id: str) -> TemplateRecord:
    record = await asyncio.to_thread(builder.templates.find_template, template_id)
    if record is None or record.tenant != tenant:
        raise NotFoundError(f"template {template_id} not found")
    return record


def _upload_token(request: Request, tenant: str, template_id: str, files_hash: str) -> str:
    mac = tokens_for(request.app).proof(_UPLOAD_PURPOSE, tenant, f"{template_id}/{files_hash}")
    return ".".join(base64.urlsafe_b64encode(part).decode().rstrip("=") for part in (tenant.encode(), mac))


def _upload_tenant(request: Request, template_id: str, files_hash: str) -> str:
    """The tenant a signed upload URL was made for; anything else is 403 (nothing is written)."""
    token = request.query_params.get("upload", "")
    try:
        tenant = base64.urlsafe_b64decode(token.split(".")[0] + "==").decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        tenant = ""
    if not tenant or not hmac.compare_digest(token, _upload_token(request, tenant, template_id, files_hash)):
        raise ForbiddenError("upload", "invalid upload signature")
    return tenant


def _files_hash(value: str) -> str:
    if not _HASH.match(value):
        raise InvalidInputError("hash", "must be a sha256 in hex (the SDK's files hash)")
    return value


@template_router.get("/templates/{template_id}/files/{files_hash}")
@template_route
async def file_upload_link(request: Request, template_id: str, files_hash: str) -> Response:
    tenant = await _tenant(request)
    builder = _builder(request)
    _files_hash(files_hash)
    await _own_template(builder, tenant, template_id)
    present = await asyncio.to_thread(builder.templates.uploaded_blob, tenant, template_id, files_hash)
    url = f"{str(request.base_url).rstrip('/')}/templates/{template_id}/files/{files_hash}"
    url += f"?upload={_upload_token(request, tenant, template_id, files_hash)}"
    return JSONResponse({"present": present is not None, "url": url}, status_code=201)


@template_router.put("/templates/{template_id}/files/{files_hash}")
@template_route
async def upload_files(request: Request, template_id: str, files_hash: str) -> Response:
    builder = _builder(request)
    _files_hash(files_hash)
    tenant = _upload_tenant(request, template_id, files_hash)
    await _own_template(builder, tenant, template_id)
    templates = builder.templates
    fd, staged = await asyncio.to_thread(templates.staging_blob)
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            pending = bytearray()
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_UPLOAD_BYTES:
                    raise InvalidInputError("body", f"is larger than {MAX_UPLOAD_BYTES} bytes")
                digest.update(chunk)
                pending += chunk
                if len(pending) >= 1 << 20:
                    await asyncio.to_thread(out.write, bytes(pending))
                    pending.clear()
            await asyncio.to_thread(_finish, out, bytes(pending))
        await asyncio.to_thread(templates.commit_blob, staged, digest.hexdigest(), tenant, template_id, files_hash)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()
        raise
    return Response(status_code=200)


def _finish(out: Any, tail: bytes) -> None:
    out.write(tail)
    out.flush()
    os.fsync(out.fileno())


@template_router.post("/v2/templates/{template_id}/builds/{build_id}")
@template_route
async def start_build(request: Request, template_id: str, build_id: str) -> Response:
    tenant = await _tenant(request)
    builder = _builder(request)
    start = await body_of(request, BuildStart)
    template = await _own_template(builder, tenant, template_id)
    build = await asyncio.to_thread(_claim, builder.templates, tenant, template_id, build_id)
    try:
        job = await asyncio.to_thread(_job, builder, template, build, start)
    except AdxError as exc:
        # The SDK raises the 400's message; the build's own status says the same to whoever polls it.
        build.status, build.finished_at = BuildStatus.ERROR, time.time()
        on_base = isinstance(exc, InvalidInputError) and exc.field in ("fromImage", "fromTemplate")
        build.reason = BuildReason(message=exc.message, step="base" if on_base else None)
        build.logs.append(LogEntry(timestamp=time.time(), level="error", message=exc.message))
        await asyncio.to_thread(builder.templates.put_build, build)
        raise
    builder.start(job, functools.partial(_mark_ready, builder.templates, builder.images))
    return Response(status_code=202)


def _claim(templates: TemplateStore, tenant: str, template_id: str, build_id: str) -> BuildRecord:
    """The build, marked as started (its first log entry) so that a second start is refused."""
    with templates.locked():
        build = templates.get_build(build_id)
        if build.tenant != tenant or build.template != template_id:
            raise NotFoundError(f"build {build_id} not found")
        if build.status is not BuildStatus.WAITING or build.logs or build.reason is not None:
            raise ConflictError(f"build {build_id} was started already")
        build.logs.append(LogEntry(timestamp=time.time(), message=f"build {build_id} queued"))
        templates.put_build(build)
        return build


def _job(builder: TemplateBuilder, template: TemplateRecord, build: BuildRecord, start: BuildStart) -> BuildJob:
    """Everything checked before the build is queued: the base image, the uploads, the steps."""
    base = base_image(start, builder.images)
    if start.from_template:
        owner = builder.templates.find_template(start.from_template)
        if owner is not None and owner.tenant != template.tenant:
            raise InvalidInputError("fromTemplate", f"no template or image named {start.from_template!r}")
    found = builder.images.find(base)
    base_user = found.user if found is not None else "user"  # debian, built on first use: its account
    blobs: dict[str, str] = {}
    for index, step in enumerate(start.steps):
        if step.type.upper() == "COPY" and step.files_hash and step.files_hash not in blobs:
            blob = builder.templates.uploaded_blob(template.tenant, template.name, step.files_hash)
            if blob is None:
                raise InvalidInputError(f"steps[{index}].filesHash", "its files were not uploaded")
            builder.templates.unpacked(blob)
            blobs[step.files_hash] = blob
    steps = to_instructions(start, base, base_user, blobs, builder.context_root, build.id)
    memory = template.memory_mb << 20 if template.memory_mb else DEFAULT_STEP_MEMORY_BYTES
    return BuildJob(record=build, start=start, steps=steps, memory_bytes=memory)


def _mark_ready(templates: TemplateStore, images: ImageStore, build: BuildRecord) -> None:
    """A good build: the template's last, and its tags move to it (``default`` also names its image NAME)."""
    with templates.locked():
        record = templates.find_template(build.template)
        if record is not None:
            assign(templates, images, record, build, build.tags or [DEFAULT_TAG], ready=True)


def _entry_view(entry: LogEntry) -> BuildLogEntry:
    view = BuildLogEntry(timestamp=_iso(entry.timestamp), level=entry.level, message=entry.message)
    return view if entry.step is None else view.model_copy(update={"step": entry.step})


@template_router.get("/templates/{template_id}/builds/{build_id}/status")
@template_route
async def build_status(request: Request, template_id: str, build_id: str) -> Response:
    tenant = await _tenant(request)
    builder = _builder(request, build=False)
    build = await asyncio.to_thread(builder.templates.get_build, build_id)
    if build.tenant != tenant or build.template != template_id:
        raise NotFoundError(f"build {build_id} not found")
    if build.status in (BuildStatus.WAITING, BuildStatus.BUILDING) and owner_is_gone(build.owner):
        message = "the build was interrupted: the API server running it stopped (start the build again)"
        build.status, build.reason = BuildStatus.ERROR, BuildReason(message=message)
        build.logs.append(LogEntry(timestamp=time.time(), level="error", message=message))
    query = request.query_params
    offset = _int_param(query.get("logsOffset"), "logsOffset", 0)
    limit = min(_int_param(query.get("limit"), "limit", MAX_LOG_PAGE), MAX_LOG_PAGE)
    page = build.logs[offset : offset + limit]
    reason = None
    if build.reason is not None:
        tail = [e for e in build.logs if e.step == build.reason.step][-20:] if build.reason.step else []
        reason = BuildStatusReason(message=build.reason.message, log_entries=[_entry_view(e) for e in tail])
        if build.reason.step is not None:
            reason = reason.model_copy(update={"step": build.reason.step})
    view = TemplateBuildInfo(
        template_id=template_id,
        build_id=build.id,
        status=build.status.value,
        log_entries=[_entry_view(e) for e in page],
        logs=[f"[{_iso(e.timestamp)}] {e.message}" for e in page],
    )
    if reason is not None:
        view = view.model_copy(update={"reason": reason})
    return JSONResponse(wire(view))


def _int_param(value: str | None, field: str, default: int) -> int:
    if value is None or value == "":
        return default
    if not value.isdigit():
        raise InvalidInputError(field, f"must be a non-negative integer, got {value!r}")
    return int(value)


@template_router.get("/templates/aliases/{alias}")
@template_route
async def alias_exists(request: Request, alias: str) -> Response:
    tenant = await _tenant(request)
    builder = _builder(request, build=False)
    record = await asyncio.to_thread(builder.templates.find_template, alias)
    if record is not None:
        if record.tenant != tenant:
            return JSONResponse({"code": 403, "message": f"template {alias} belongs to another team"}, status_code=403)
        if record.ready_build is not None:
            return JSONResponse({"templateID": alias, "public": False})
    elif alias in NODE_IMAGES or await asyncio.to_thread(_is_image, builder, alias):
        return JSONResponse({"templateID": alias, "public": True})  # an image every tenant may start
    raise NotFoundError(f"template {alias} not found")


def _is_image(builder: TemplateBuilder, name: str) -> bool:
    try:
        return builder.images.find(name) is not None
    except InvalidInputError:
        return False


@template_router.delete("/templates/{template_id}")
@template_route
async def delete_template(request: Request, template_id: str) -> Response:
    """A template of the tenant: its image and record go (refused, 409, while a sandbox runs on it). Any other
    ID is a snapshot's (the SDK deletes snapshots as templates)."""
    p = plane(request)
    tenant = await _tenant(request)
    found = None
    with contextlib.suppress(_NotConfigured):
        found = await asyncio.to_thread(_builder(request, build=False).templates.find_template, template_id)
    if found is None or found.tenant != tenant:
        await delete_snapshot(p, tenant, template_id)
        return Response(status_code=204)
    builder = _builder(request, build=False)
    if _in_progress(builder.templates, found):
        raise ConflictError(f"a build of template {template_id!r} is in progress")
    await asyncio.to_thread(_remove_images, builder, found)
    await asyncio.to_thread(builder.templates.remove_template, template_id)
    return Response(status_code=204)


def _remove_images(builder: TemplateBuilder, record: TemplateRecord) -> None:
    """The template's images: its name's (the ``default`` tag) first, then each build's. A sandbox on one refuses
    the deletion (409, ImageStore.rm); the record stays until all are gone, so asking again finishes it."""
    for name in [record.name, *(build_image(record.name, b) for b in record.builds)]:
        if _is_image(builder, name):
            builder.images.rm(name)
