"""E2B's template tags on ADX images: ``name:tag`` in a build, ``Sandbox.create("name:tag")``, ``assign_tags``,
``remove_tags``, ``get_tags``.

As E2B's API: a tag of a template names one of its builds; a build gets the tags its request names (``name:tag``
and ``tags``, lowercased, deduplicated, ``[a-z0-9._-]+`` and not a UUID) or, naming none, ``default``; a tag
moves to a newer build that gets it, and ``name`` alone means ``name:default``. The tags are assigned when the
build is ready (a failed build moves no tag).

On ADX every build makes its own image, ``<name>--<first 8 of its ID>`` (adx.e2b._template_build); the template's
``default`` tag also names it ``<name>`` (a copy of the manifest: the same layers), so ``Sandbox.create(name)``,
``from_template(name)`` and ``adx`` itself start the default build by the template's own name, and
``Sandbox.create("name:tag")`` starts the image of the build the tag names.
"""

from __future__ import annotations

import re
import time
import uuid

from adx.e2b._template_store import BuildRecord, TagAssignment, TemplateRecord, TemplateStore
from adx.errors import InvalidInputError, NotFoundError
from adx.images import ImageStore, validate_image_name

DEFAULT_TAG = "default"
SEPARATOR = ":"
_TAG = re.compile(r"^[a-z0-9._-]+$")
#: ``<name>--`` and 8 characters of the build ID must fit an image name (63).
MAX_NAME = 53


def parse_name(value: str, field: str) -> tuple[str, str | None]:
    """``name`` or ``name:tag`` (trimmed, lowercased, as E2B reads them) -> (name, tag or None)."""
    name, separator, tag = value.strip().lower().partition(SEPARATOR)
    name = validate_image_name(name.strip(), field)
    if not separator:
        return name, None
    return name, normalize_tags([tag], field)[0]


def normalize_tags(tags: list[str], field: str) -> list[str]:
    """E2B's tag rule, each once (in the order given)."""
    out: list[str] = []
    for raw in tags:
        tag = raw.strip().lower() if isinstance(raw, str) else ""
        if not _TAG.match(tag):
            raise InvalidInputError(field, f"invalid tag {raw!r}: 1 or more of [a-z0-9._-]")
        if _is_uuid(tag):
            raise InvalidInputError(field, f"invalid tag {raw!r}: a tag cannot be a UUID")
        if tag not in out:
            out.append(tag)
    return out


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def build_image(name: str, build_id: str) -> str:
    """The image one build of template ``name`` makes."""
    return f"{name}--{build_id.replace('-', '')[:8]}"


def image_of(build: BuildRecord) -> str:
    """The image a build made (builds from before tags made the template's own name)."""
    return build.image or build.template


def check_name_length(name: str, field: str) -> None:
    if len(name) > MAX_NAME:
        raise InvalidInputError(field, f"{name!r}: at most {MAX_NAME} characters (a build's image is NAME--BUILD)")


def tags_of(record: TemplateRecord) -> dict[str, TagAssignment]:
    """The template's tags; a template built before tags has its last good build as ``default``."""
    if record.tags or record.ready_build is None:
        return dict(record.tags)
    return {DEFAULT_TAG: TagAssignment(build=record.ready_build, assigned_at=record.updated_at or record.created_at)}


def assign(
    templates: TemplateStore,
    images: ImageStore,
    record: TemplateRecord,
    build: BuildRecord,
    tags: list[str],
    *,
    ready: bool = False,
) -> TemplateRecord:
    """``tags`` name ``build`` from now on (called under the store's lock); ``default`` also names its image
    ``<template>``; ``ready``: the build just finished, the template's last good one. Returns the record written."""
    now = time.time()
    if DEFAULT_TAG in tags and image_of(build) != record.name:
        made = images.get(image_of(build))
        images.put(made.model_copy(update={"name": record.name}))
    current = tags_of(record)
    current.update({tag: TagAssignment(build=build.id, assigned_at=now) for tag in tags})
    changes: dict[str, object] = {"tags": current, "updated_at": now}
    if ready:
        changes["ready_build"] = build.id
    updated = record.model_copy(update=changes)
    templates.put_template(updated)
    return updated


def remove(templates: TemplateStore, record: TemplateRecord, tags: list[str]) -> None:
    """The tags name no build any more (``default`` cannot go: 400, as E2B's); ones it does not have are no
    error. The builds' images stay (a sandbox may run on one)."""
    if DEFAULT_TAG in tags:
        raise InvalidInputError("tags", f"cannot delete the '{DEFAULT_TAG}' tag")
    current = {tag: held for tag, held in tags_of(record).items() if tag not in tags}
    templates.put_template(record.model_copy(update={"tags": current, "updated_at": time.time()}))


def tagged_build(templates: TemplateStore, record: TemplateRecord, tag: str | None) -> BuildRecord:
    """The build ``tag`` (None: ``default``) of the template names; 404 when it names none."""
    wanted = tag or DEFAULT_TAG
    held = tags_of(record).get(wanted)
    if held is None:
        raise NotFoundError(f"template '{record.name}' with tag '{wanted}' not found")
    return templates.get_build(held.build)


def resolve_image(templates: TemplateStore, name: str, tag: str) -> str:
    """The image ``Sandbox.create("name:tag")`` starts. ``default`` is the template's own name (also for an image
    that is no template: ``base:default``); any other tag needs a template: 404 naming both when there is none. As
    by its name, any tenant may start another tenant's template (images are not tenant-private)."""
    record = templates.find_template(name)
    if tag == DEFAULT_TAG and (record is None or DEFAULT_TAG in tags_of(record)):
        return name
    if record is None:
        raise NotFoundError(f"template '{name}:{tag}' not found", details={"field": "templateID"})
    return image_of(tagged_build(templates, record, tag))
