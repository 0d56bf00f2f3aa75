"""E2B's template steps (``TemplateBuildStartV2``) as steps of ADX's image builder (adx.sandboxd's ``build_steps``).

- FROM: ``from_base_image()`` (``e2bdev/base``, also a template without FROM) is the node's ``base`` when that is a
  store image, else ``debian``; ``debian:bookworm`` (``:12``) is ``debian``; ``from_image(NAME)`` and
  ``from_template(NAME)`` name an image of the store. Anything else (``python:3``, a registry with credentials) is
  refused naming the image: this server pulls from no registry.
- ``RUN [cmd, user]`` (``run_cmd``, ``pip_install``, ``apt_install``, ``npm_install``, ...): RUN as ``user``, else
  the current USER. ``COPY [src, dest, user, mode]`` with ``filesHash``: COPY of the uploaded files, owned by
  ``user`` (else root) with ``mode``. ``ENV``, ``WORKDIR``, ``USER``: the same.
- ``force`` (``skip_cache()``): from that step on the keys include the build's ID, so those layers are rebuilt.
- ``startCmd``, ``readyCmd`` (``set_start_cmd``, ``set_ready_cmd``): recorded on the image's manifest; every
  sandbox created from the template runs them before its create answers (adx.e2b._start_cmd).

Steps run as the base image's user (``user`` on Debian, as on E2B's base image, whose ``pip_install`` and
``apt_install`` ask for ``root`` themselves). E2B numbers the steps from 1 (``base`` is the FROM): each ADX step
carries that number as its ``line``, so a failure names the step the SDK points its traceback at.
"""

from __future__ import annotations

import glob
import posixpath
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from adx.errors import InvalidInputError
from adx.images import ImageStore, Instruction, Op

__all__ = ["BuildStart", "TemplateStep", "base_image", "to_instructions"]

#: E2B's own base image (``Template().from_base_image()``; also a template with no FROM at all).
E2B_BASE = "e2bdev/base"
#: The Debian release the store's ``debian`` image is (adx.images._debian).
_DEBIAN_TAGS = frozenset({"bookworm", "12", "bookworm-slim", "12-slim"})


class TemplateStep(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: str
    args: list[str] = Field(default_factory=list)
    files_hash: str | None = Field(default=None, alias="filesHash")
    force: bool = False
    force_upload: bool | None = Field(default=None, alias="forceUpload")


class BuildStart(BaseModel):
    """The body of ``POST /v2/templates/{id}/builds/{buildID}``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_image: str | None = Field(default=None, alias="fromImage")
    from_template: str | None = Field(default=None, alias="fromTemplate")
    from_image_registry: dict[str, str] | None = Field(default=None, alias="fromImageRegistry")
    force: bool = False
    steps: list[TemplateStep] = Field(default_factory=list)
    start_cmd: str | None = Field(default=None, alias="startCmd")
    ready_cmd: str | None = Field(default=None, alias="readyCmd")


def _not_here(image: str, why: str) -> InvalidInputError:
    return InvalidInputError(
        "fromImage",
        f"{image!r} {why}: this server pulls no registry images. Use an image of its store: base, debian "
        "(Debian 12), another template, or an image made with adx image build / adx image import",
    )


def base_image(start: BuildStart, store: ImageStore) -> str:
    """The store image the build starts from (see the table above); a clear error naming the image otherwise."""
    if start.from_template:
        if not _in_store(store, start.from_template):
            raise InvalidInputError("fromTemplate", f"no template or image named {start.from_template!r}")
        return start.from_template
    image = start.from_image or E2B_BASE
    if start.from_image_registry:
        raise _not_here(image, "is in a private registry")
    repository, _, tag = image.partition(":")
    if repository == E2B_BASE:
        return "base" if store.find("base") is not None else "debian"
    if repository in ("debian", "docker.io/library/debian", "library/debian"):
        if not tag or tag in _DEBIAN_TAGS:
            return "debian"
        raise _not_here(image, "is not here (this server's debian image is Debian 12, tag 'bookworm')")
    if not tag and _in_store(store, image):
        return image
    raise _not_here(image, "is not an image of this server")


def _in_store(store: ImageStore, name: str) -> bool:
    try:
        return store.find(name) is not None
    except InvalidInputError:  # not even an image name (uppercase, a path): not one of the store's
        return False


def _mode(value: str, where: str) -> int | None:
    if not value:
        return None
    try:
        mode = int(value, 8)
    except ValueError:
        raise InvalidInputError(where, f"mode {value!r} is not an octal number") from None
    if not 0 <= mode <= 0o7777:
        raise InvalidInputError(where, f"mode {value!r} is not a permission mode")
    return mode


def _sources(context_root: Path, blob: str, src: str, where: str) -> list[str]:
    """The uploaded archive holds the files ``src`` matched, at their paths relative to the SDK's context:
    the same pattern, inside the unpacked archive, names them (relative to ``context_root``)."""
    tree = context_root / blob
    pattern = posixpath.normpath(src.lstrip("/"))
    if pattern == ".." or pattern.startswith("../"):
        raise InvalidInputError(where, f"COPY source {src!r} leaves the build context")
    found = sorted(glob.glob(glob.escape(str(tree)) + "/" + pattern, recursive=True)) if pattern != "." else [str(tree)]
    if not found:
        raise InvalidInputError(where, f"no uploaded file matches {src!r}")
    return [str(Path(path).relative_to(context_root)) for path in found]


def to_instructions(
    start: BuildStart,
    base: str,
    base_user: str,
    blobs: dict[str, str],
    context_root: Path,
    build_id: str,
) -> list[Instruction]:
    """ADX builder steps for ``start`` on image ``base`` (whose user is ``base_user``); ``blobs`` maps each COPY
    step's files hash to its unpacked archive under ``context_root``."""
    steps = [Instruction(Op.FROM, 0, (base,))]
    if base_user not in ("root", "0"):
        steps.append(Instruction(Op.USER, 0, (base_user,)))
    if start.force:
        steps.append(_salt(0, build_id))
    forced = start.force
    for number, step in enumerate(start.steps, 1):
        where = f"steps[{number - 1}]"
        if step.force and not forced:
            steps.append(_salt(number, build_id))
            forced = True
        args = step.args
        kind = step.type.upper()
        if kind == "RUN":
            if not args or not args[0].strip():
                raise InvalidInputError(f"{where}.args", "RUN needs a command")
            user = args[1] if len(args) > 1 and args[1] else None
            steps.append(Instruction(Op.RUN, number, (args[0],), shell=True, user=user))
        elif kind == "COPY":
            if len(args) < 2 or not args[0] or not args[1]:
                raise InvalidInputError(f"{where}.args", "COPY needs [src, dest, user, mode]")
            if not step.files_hash or step.files_hash not in blobs:
                raise InvalidInputError(f"{where}.filesHash", f"the files of COPY {args[0]!r} were not uploaded")
            sources = _sources(context_root, blobs[step.files_hash], args[0], f"{where}.args")
            user = args[2] if len(args) > 2 and args[2] else None
            mode = _mode(args[3] if len(args) > 3 else "", f"{where}.args")
            steps.append(Instruction(Op.COPY, number, (*sources, args[1]), user=user, mode=mode))
        elif kind == "ENV":
            if not args or len(args) % 2:
                raise InvalidInputError(f"{where}.args", "ENV needs name, value pairs")
            steps.append(Instruction(Op.ENV, number, tuple(args)))
        elif kind in ("WORKDIR", "USER"):
            if len(args) != 1 or not args[0]:
                raise InvalidInputError(f"{where}.args", f"{kind} needs one value")
            steps.append(Instruction(Op(kind), number, (args[0],)))
        else:
            raise InvalidInputError(
                f"{where}.type", f"{step.type!r} is not a step type (RUN, COPY, ENV, WORKDIR, USER)"
            )
    return steps


def _salt(number: int, build_id: str) -> Instruction:
    """E2B's ``force``/``skip_cache``: an ARG naming this build changes every later step's key, so nothing after it
    comes from the cache (its layers are built anew)."""
    return Instruction(Op.ARG, number, ("ADX_E2B_FORCE_BUILD", build_id), defaults={"ADX_E2B_FORCE_BUILD": True})
