"""E2B's template catalog routes: tags (adx.e2b._template_tags) and listing and describing templates.

| E2B SDK / API | route | ADX |
|---|---|---|
| ``Template.assign_tags(target, tags)`` | ``POST /templates/tags`` ``{target, tags}`` | 201 ``{tags, buildID}`` |
| ``Template.remove_tags(name, tags)`` | ``DELETE /templates/tags`` ``{name, tags}`` | 204 |
| ``Template.get_tags(name)`` | ``GET /templates/{id}/tags`` | ``[{tag, buildID, createdAt}]``, newest first |
| (API) list templates | ``GET /templates`` | the tenant's templates, oldest first (E2B's order) |
| (API) describe a template | ``GET /templates/{id}`` | the template and its builds, newest first (paged) |

A template of another tenant is 403 (E2B's "You don't have access"), a missing one 404. These routes have a
router of their own, included before the template routes: ``DELETE /templates/tags`` is not a template's deletion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from adx.e2b._bodies import AssignTemplateTags, DeleteTemplateTags, body_of
from adx.e2b._control import ENVD_VERSION, E2bRoute, _tenant, page_limit, paged
from adx.e2b._template_store import BuildRecord, BuildStatus, TemplateRecord, TemplateStore, owner_is_gone
from adx.e2b._template_tags import DEFAULT_TAG, assign, normalize_tags, parse_name, remove, tagged_build, tags_of
from adx.e2b._templates import _builder, _iso, template_route
from adx.errors import ForbiddenError, InvalidInputError, NotFoundError
from adx.images import ImageStore

__all__ = ["catalog_router"]

catalog_router = APIRouter(include_in_schema=False, route_class=E2bRoute)
T = TypeVar("T")
#: What a template's sandboxes get when its builds asked for nothing (E2B's defaults are the API's, docs/e2b.md).
DEFAULT_CPU_COUNT = 1
DEFAULT_MEMORY_MB = 512
_NO_BUILD = "00000000-0000-0000-0000-000000000000"


def _owned(templates: TemplateStore, tenant: str, name: str) -> TemplateRecord:
    record = templates.find_template(name)
    if record is None:
        raise NotFoundError(f"template '{name}' not found")
    if record.tenant != tenant:
        raise ForbiddenError("template", f"You don't have access to sandbox template '{name}'")
    return record


async def _locked(request: Request, work: Callable[[TemplateStore, ImageStore], T]) -> T:
    builder = _builder(request, build=False)

    def run() -> T:
        with builder.templates.locked():
            return work(builder.templates, builder.images)

    return await asyncio.to_thread(run)


def _some_tags(given: list[str]) -> list[str]:
    tags = normalize_tags(given, "tags")
    if not tags:
        raise InvalidInputError("tags", "at least one tag is required")
    return tags


@catalog_router.post("/templates/tags")
@template_route
async def assign_tags(request: Request) -> Response:
    tenant = await _tenant(request)
    _builder(request, build=False)  # 501 before the body is read where no builds are served
    body = await body_of(request, AssignTemplateTags)
    name, tag = parse_name(body.target, "target")
    tags = _some_tags(body.tags)

    def work(templates: TemplateStore, images: ImageStore) -> BuildRecord:
        record = _owned(templates, tenant, name)
        build = tagged_build(templates, record, tag)
        assign(templates, images, record, build, tags)
        return build

    build = await _locked(request, work)
    return JSONResponse({"tags": tags, "buildID": build.id}, status_code=201)


@catalog_router.delete("/templates/tags")
@template_route
async def remove_tags(request: Request) -> Response:
    tenant = await _tenant(request)
    _builder(request, build=False)
    body = await body_of(request, DeleteTemplateTags)
    tags = _some_tags(body.tags)
    name, tag = parse_name(body.name, "name")
    if tag is not None:
        raise InvalidInputError("name", "Template name should not contain a tag, use the 'tags' field instead")
    await _locked(request, lambda templates, _: remove(templates, _owned(templates, tenant, name), tags))
    return Response(status_code=204)


@catalog_router.get("/templates/{template_id}/tags")
@template_route
async def get_tags(request: Request, template_id: str) -> Response:
    tenant = await _tenant(request)
    name, _ = parse_name(template_id, "templateID")
    record = await _locked(request, lambda templates, _: _owned(templates, tenant, name))
    held = sorted(tags_of(record).items(), key=lambda item: (item[1].assigned_at, item[0]), reverse=True)
    return JSONResponse([{"tag": tag, "buildID": at.build, "createdAt": _iso(at.assigned_at)} for tag, at in held])


def _builds(templates: TemplateStore, record: TemplateRecord) -> list[BuildRecord]:
    found = []
    for build_id in record.builds:
        try:
            build = templates.get_build(build_id)
        except NotFoundError:
            continue
        if build.status in (BuildStatus.WAITING, BuildStatus.BUILDING) and owner_is_gone(build.owner):
            build = build.model_copy(update={"status": BuildStatus.ERROR})  # as its status route says
        found.append(build)
    return found


def _template_view(templates: TemplateStore, record: TemplateRecord, builds: list[BuildRecord]) -> dict[str, object]:
    """E2B's ``Template``, as its list query makes it: ``buildID`` is the build the ``default`` tag names (the
    zero UUID before one is ready), ``buildStatus`` the status of the newest build asked to get ``default``
    (``waiting`` before any)."""
    default = tags_of(record).get(DEFAULT_TAG)
    asked = [b for b in builds if DEFAULT_TAG in (b.tags or [DEFAULT_TAG])]
    status = asked[-1].status if asked else BuildStatus.WAITING
    return {
        "templateID": record.name,
        "buildID": default.build if default is not None else _NO_BUILD,
        "cpuCount": record.cpu_count or DEFAULT_CPU_COUNT,
        "memoryMB": record.memory_mb or DEFAULT_MEMORY_MB,
        "diskSizeMB": 0,
        "public": False,
        "aliases": [record.name],
        "names": [record.name],
        "createdAt": _iso(record.created_at),
        "updatedAt": _iso(record.updated_at or record.created_at),
        "createdBy": None,
        "lastSpawnedAt": None,
        "spawnCount": 0,
        "buildCount": len(builds),
        "envdVersion": ENVD_VERSION,
        "buildStatus": status.value,
    }


@catalog_router.get("/templates")
@template_route
async def list_templates(request: Request) -> Response:
    tenant = await _tenant(request)

    def work(templates: TemplateStore, _: ImageStore) -> list[dict[str, object]]:
        own = sorted((r for r in templates.templates() if r.tenant == tenant), key=lambda r: (r.created_at, r.name))
        return [_template_view(templates, r, _builds(templates, r)) for r in own]

    return JSONResponse(await _locked(request, work))


@catalog_router.get("/templates/{template_id}")
@template_route
async def get_template(request: Request, template_id: str) -> Response:
    tenant = await _tenant(request)
    name, _ = parse_name(template_id, "templateID")
    limit = page_limit(request.query_params)

    def work(templates: TemplateStore, _: ImageStore) -> tuple[dict[str, object], list[BuildRecord]]:
        record = _owned(templates, tenant, name)
        builds = _builds(templates, record)
        return _template_view(templates, record, builds), builds

    view, builds = await _locked(request, work)
    newest = sorted(builds, key=lambda b: (b.created_at, b.id), reverse=True)
    page, headers = paged(
        newest, [(b.created_at, b.id) for b in newest], request.query_params.get("nextToken"), limit, newest_first=True
    )
    view["builds"] = [_build_view(view, b) for b in page]
    return JSONResponse(view, headers=headers)


def _build_view(template: dict[str, object], build: BuildRecord) -> dict[str, object]:
    out: dict[str, object] = {
        "buildID": build.id,
        "status": build.status.value,
        "createdAt": _iso(build.created_at),
        "updatedAt": _iso(build.finished_at or build.created_at),
        "cpuCount": template["cpuCount"],
        "memoryMB": template["memoryMB"],
        "envdVersion": ENVD_VERSION,
    }
    if build.finished_at is not None:
        out["finishedAt"] = _iso(build.finished_at)
    return out
