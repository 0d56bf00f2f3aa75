"""``adx image build``: a Dockerfile subset, one content-addressed layer per filesystem step.

Every step has a cache key: ``layer_digest(previous key, the step's canonical text [, digest of copied files])``,
chained from the FROM image's layers. ``RUN`` runs in a real sandbox of sandboxd (no execd: PID 1 is the step's
shell) on the layers so far; once it exits 0 its upper layer becomes the step's layer (``CommitLayer``). ``COPY``
and a ``WORKDIR`` that must create its directory assemble their small layer directly. ``ENV``, ``ARG``, ``USER``
and ``WORKDIR`` change the manifest and the keys of the steps after them. Steps run as root until a ``USER``
step, whatever the base image's user (E2B's templates build so); the image keeps the base's user unless a
``USER`` step names another. A step whose key is a layer of the store
is reused ("cached"): changing one step rebuilds from that step on, and an unchanged Dockerfile builds nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypedDict, Unpack

from adx.errors import ImageBuildError, InvalidInputError
from adx.images import ImageManifest, ImageStore, Instruction, Op, ensure_debian_image, layer_digest
from adx.images._dockerfile import parse_dockerfile, substitute
from adx.sandboxd._client import SandboxdClient, ref_of
from adx.sandboxd._models import CommitLayerRequest, CreateRequest, ResourcesSpec, SandboxRef

__all__ = ["BuildResult", "StepEvent", "build_image", "build_steps"]

#: FROM names built from Debian's packages on first use when the store lacks them.
_DEBIAN_NAMES = ("debian",)


@dataclass(frozen=True)
class StepEvent:
    """One step's progress: ``status`` is ``running``, ``built``, ``cached`` or ``config`` (no layer)."""

    index: int
    total: int
    text: str
    status: str
    seconds: float = 0.0
    layer: str | None = None
    output: str = ""


@dataclass
class BuildResult:
    manifest: ImageManifest
    steps: list[StepEvent] = field(default_factory=list)

    @property
    def built(self) -> int:
        return sum(1 for s in self.steps if s.status == "built")

    @property
    def cached(self) -> int:
        return sum(1 for s in self.steps if s.status == "cached")


@dataclass
class _State:
    key: str
    layers: list[str]
    env: dict[str, str]
    workdir: str
    user: str  # RUN steps run as this account: root until a USER step (E2B's templates build as root)
    runtime_user: str  # the manifest's: the base image's until a USER step
    args: dict[str, str]
    history: list[str]


def _content_digest(context: Path, sources: list[str], line: int) -> tuple[str, list[Path]]:
    """sha256 over the names, modes and bytes of every file ``sources`` name (inside ``context`` only)."""
    root = context.resolve()
    paths: list[Path] = []
    h = hashlib.sha256()
    for src in sources:
        path = (root / src).resolve()
        if path != root and root not in path.parents:
            raise InvalidInputError("dockerfile", f"line {line}: COPY source {src!r} is outside the build context")
        if not path.exists():
            raise InvalidInputError("dockerfile", f"line {line}: COPY source {src!r} does not exist in the context")
        paths.append(path)
        walk = [path] if not path.is_dir() else sorted(p for p in path.rglob("*"))
        for p in walk:
            st = p.lstat()
            h.update(f"{p.relative_to(root)}\0{st.st_mode:o}\0".encode())
            if p.is_symlink():
                h.update(os.readlink(p).encode())
            elif p.is_file():
                with open(p, "rb") as f:
                    for chunk in iter(lambda f=f: f.read(1 << 20), b""):  # type: ignore[misc]
                        h.update(chunk)
    return h.hexdigest(), paths


def _copy_into(
    tree: Path,
    paths: list[Path],
    dest: str,
    owner: tuple[int, int] = (0, 0),
    mode: int | None = None,
    lowers: tuple[Path, ...] = (),
) -> None:
    """Docker's COPY: a directory's contents go into ``dest``; files go into ``dest/`` when it ends with ``/`` or
    several sources are given, else become ``dest``. Owned by ``owner`` (uid, gid; root unless said); ``mode``
    sets the copied entries' permission bits. Directories on the way that the image has keep its owner and mode;
    new ones are root's, 0755."""
    into_dir = dest.endswith("/") or len(paths) > 1
    target = tree / dest.lstrip("/")
    copied: list[Path] = []
    for path in paths:
        if path.is_dir():
            shutil.copytree(path, target, symlinks=True, dirs_exist_ok=True)
            rel = target.relative_to(tree)
            existed = any((lower / rel).is_dir() for lower in lowers)  # an existing dest keeps its owner
            copied += [*([] if existed else [target]), *target.rglob("*")]
        else:
            out = target / path.name if into_dir else target
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out, follow_symlinks=False)
            copied.append(out)
    for dirpath, dirs, files in os.walk(tree):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(dirpath, name), 0, 0)
    _inherit_lower_dirs(tree, lowers)
    for entry in copied:
        os.lchown(entry, *owner)
        if mode is not None and not entry.is_symlink():
            os.chmod(entry, mode)


def _account(store: ImageStore, layers: list[str], spec: str, line: int) -> tuple[int, int]:
    """``user[:group]`` (names or numbers) as (uid, gid), looked up in the topmost layer's passwd and group."""
    user, _, group = spec.partition(":")

    def table(name: str) -> list[list[str]]:
        for digest in reversed(layers):
            path = store.layer_tree(digest) / "etc" / name
            if path.is_file():
                return [row.split(":") for row in path.read_text(errors="replace").splitlines() if row.count(":") >= 3]
        return []

    def lookup(value: str, rows: list[list[str]], what: str) -> tuple[int, int]:
        if value.isdigit():
            return int(value), -1
        for row in rows:
            if row[0] == value:
                return int(row[2]), int(row[3]) if what == "user" else -1
        raise InvalidInputError("dockerfile", f"line {line}: COPY owner: no {what} {value!r} in the image")

    uid, primary = lookup(user, table("passwd"), "user")
    gid = lookup(group, table("group"), "group")[0] if group else primary
    return uid, gid if gid >= 0 else uid


def _mkdir(rel: str, tree: Path, lowers: tuple[Path, ...] = ()) -> None:
    (tree / rel).mkdir(parents=True)
    _inherit_lower_dirs(tree, lowers)


def _inherit_lower_dirs(tree: Path, lowers: tuple[Path, ...]) -> None:
    """A directory a direct layer holds only as the way to its files (``/home/user`` of ``COPY a /home/user/a``)
    keeps the owner and mode it has below (``lowers``: the layers' trees, topmost first), as Docker's do: else
    the new layer's root-owned copy would hide the image's own (``user`` could no longer write its home)."""
    for dirpath, dirs, _files in os.walk(tree):
        for name in dirs:
            made = Path(dirpath, name)
            rel = made.relative_to(tree)
            for lower in lowers:
                below = lower / rel
                if below.is_dir() and not below.is_symlink():
                    st = below.lstat()
                    os.lchown(made, st.st_uid, st.st_gid)
                    os.chmod(made, stat.S_IMODE(st.st_mode))
                    break


def _exists_in_layers(store: ImageStore, layers: list[str], path: str) -> bool:
    rel = path.strip("/")
    return any((store.layer_tree(d) / rel).is_dir() for d in layers)


def _run_argv(ins: Instruction, user: str) -> list[str]:
    argv = ["/bin/sh", "-c", ins.args[0]] if ins.shell else list(ins.args)
    if user in ("root", "0"):
        return argv
    # setpriv (util-linux, essential in Debian) needs no PAM session; the group is looked up inside.
    drop = 'exec setpriv --reuid="$0" --regid="$(id -g "$0")" --init-groups -- "$@"'
    return ["/bin/sh", "-c", drop, user, *argv]


async def _run_step(
    client: SandboxdClient,
    state: _State,
    ins: Instruction,
    key: str,
    text: str,
    *,
    network: str | None,
    memory_bytes: int,
    step_timeout: float,
) -> str:
    """Run one RUN step in a sandbox on ``state.layers``; commit its upper layer as ``key``. Returns its output."""
    argv = _run_argv(ins, ins.user or state.user)
    env = {**state.env, **state.args}
    created = await client.create(
        CreateRequest(
            request_id=f"image-build-{uuid.uuid4().hex}",
            argv=argv,
            env=env,
            cwd=state.workdir,
            image_layers=state.layers,
            network=network,  # type: ignore[arg-type]
            resources=ResourcesSpec(memory_bytes=memory_bytes),
            metadata={"adx.image-build": text[:200]},
        )
    )
    ref: SandboxRef = ref_of(created)
    try:
        waited = await client.wait(ref, timeout_seconds=step_timeout)
        output = (await client.output(ref)).output
        if not waited.done:
            raise ImageBuildError(f"line {ins.line}: step did not finish within {step_timeout:.0f}s: {text}\n{output}")
        status = waited.sandbox.exit
        code = status.exit_code if status is not None else None
        if code != 0:
            how = f"exit code {code}" if code is not None else f"signal {status.signal if status else '?'}"
            raise ImageBuildError(
                f"line {ins.line}: {text} failed ({how})\n{output}", details={"line": ins.line, "exitCode": code}
            )
        parent = state.layers[-1] if state.layers else None
        await client.commit_layer(CommitLayerRequest(ref=ref, digest=key, parent=parent, step=text))
        return output
    finally:
        await client.delete(ref)


class BuildOptions(TypedDict, total=False):
    """``build_steps``'s optional keywords that ``build_image`` passes through (their defaults are there)."""

    build_args: dict[str, str] | None
    network: str | None
    memory_bytes: int
    step_timeout: float
    progress: Callable[[StepEvent], None] | None
    base_progress: Callable[[str], None] | None


async def build_image(
    client: SandboxdClient,
    store: ImageStore,
    dockerfile: str,
    name: str,
    *,
    context: Path,
    **options: Unpack[BuildOptions],
) -> BuildResult:
    """Build image ``name`` from ``dockerfile`` (text) with ``context`` for COPY; returns the manifest and what
    each step did. The manifest is written only when every step succeeded."""
    return await build_steps(client, store, parse_dockerfile(dockerfile), name, context=context, **options)


async def build_steps(
    client: SandboxdClient,
    store: ImageStore,
    steps: list[Instruction],
    name: str,
    *,
    context: Path,
    build_args: dict[str, str] | None = None,
    network: str | None = None,
    memory_bytes: int = 1 << 30,
    step_timeout: float = 3600.0,
    progress: Callable[[StepEvent], None] | None = None,
    base_progress: Callable[[str], None] | None = None,
    start_cmd: str | None = None,
    ready_cmd: str | None = None,
) -> BuildResult:
    """Build image ``name`` from parsed ``steps`` (FROM first; what ``parse_dockerfile`` makes, or E2B's template
    steps, adx.e2b); ``start_cmd``/``ready_cmd`` are recorded on the manifest (E2B's template start command)."""
    from adx.images import validate_image_name

    validate_image_name(name, "name")
    given = dict(build_args or {})
    report = progress or (lambda _e: None)
    result = BuildResult(manifest=ImageManifest(name=name, layers=[]))
    global_args: dict[str, str] = {}
    state: _State | None = None
    total = len(steps)
    for index, ins in enumerate(steps, 1):
        t0 = time.monotonic()
        if ins.op is Op.ARG:
            scope = state.args if state is not None else global_args
            for arg, default in zip(ins.args[::2], ins.args[1::2], strict=True):
                scope[arg] = given.get(arg, substitute(default, {**global_args, **scope}))
            text = f"ARG {json.dumps({k: scope[k] for k in ins.args[::2]}, sort_keys=True)}"
            if state is not None:
                state.key = layer_digest(state.key, text)
                state.history.append(text)
            event = StepEvent(index, total, text, "config")
        elif ins.op is Op.FROM:
            base_name = substitute(ins.args[0], global_args)
            if base_name == "scratch":
                base = ImageManifest(name="scratch", layers=[])
            else:
                base_or_none = store.find(base_name)
                if base_or_none is None and base_name in _DEBIAN_NAMES:
                    base_or_none, _ = ensure_debian_image(store, base_name, progress=base_progress)
                if base_or_none is None:
                    raise InvalidInputError(
                        "dockerfile", f"line {ins.line}: FROM {base_name}: no such image in the store (adx image list)"
                    )
                base = base_or_none
            text = f"FROM {base_name}"
            state = _State(
                key=layer_digest(None, f"FROM {json.dumps(base.layers)}"),
                layers=list(base.layers),
                env=dict(base.env),
                workdir=base.workdir,
                user="root",
                runtime_user=base.user,
                args={},
                history=[*base.history, text],
            )
            event = StepEvent(index, total, text, "config")
        else:
            assert state is not None  # the parser puts FROM first
            vars_ = {**global_args, **state.env, **state.args}
            if ins.op is Op.ENV:
                for key_, value in zip(ins.args[::2], ins.args[1::2], strict=True):
                    state.env[key_] = substitute(value, vars_)
                text = f"ENV {json.dumps(state.env, sort_keys=True)}"
                state.key = layer_digest(state.key, text)
                event = StepEvent(index, total, text, "config")
            elif ins.op is Op.USER:
                state.user = state.runtime_user = substitute(ins.args[0], vars_)
                text = f"USER {state.user}"
                state.key = layer_digest(state.key, text)
                event = StepEvent(index, total, text, "config")
            elif ins.op is Op.WORKDIR:
                state.workdir = posixpath.normpath(posixpath.join(state.workdir, substitute(ins.args[0], vars_)))
                text = f"WORKDIR {state.workdir}"
                state.key = layer_digest(state.key, text)
                if _exists_in_layers(store, state.layers, state.workdir):
                    event = StepEvent(index, total, text, "config")
                else:
                    workdir = state.workdir.lstrip("/")
                    event = _direct_layer(store, state, text, partial(_mkdir, workdir, lowers=_lowers(store, state)))
            elif ins.op is Op.COPY:
                srcs = [substitute(a, vars_) for a in ins.args[:-1]]
                dest = substitute(ins.args[-1], vars_)
                if not dest.startswith("/"):
                    dest = posixpath.join(state.workdir, dest)  # keeps a trailing "/" (into a directory)
                content, paths = _content_digest(context, srcs, ins.line)
                text = Instruction(Op.COPY, ins.line, (*srcs, dest), user=ins.user, mode=ins.mode).text()
                owner = _account(store, state.layers, ins.user, ins.line) if ins.user else (0, 0)
                state.key = layer_digest(state.key, text, content)
                lowers = _lowers(store, state)
                fill = partial(_copy_into, paths=paths, dest=dest, owner=owner, mode=ins.mode, lowers=lowers)
                event = _direct_layer(store, state, text, fill)
            else:  # RUN
                text = ins.text()
                state.key = layer_digest(state.key, text, json.dumps([ins.user or state.user, state.workdir]))
                if store.has_layer(state.key):
                    state.layers.append(state.key)
                    event = StepEvent(index, total, text, "cached", layer=state.key)
                else:
                    report(StepEvent(index, total, text, "running"))
                    output = await _run_step(
                        client,
                        state,
                        ins,
                        state.key,
                        text,
                        network=network,
                        memory_bytes=memory_bytes,
                        step_timeout=step_timeout,
                    )
                    state.layers.append(state.key)
                    event = StepEvent(
                        index, total, text, "built", time.monotonic() - t0, layer=state.key, output=output
                    )
            state.history.append(text)
        if event.status != "built" or event.index == 0:  # direct layers, config steps: their index and time here
            event = StepEvent(index, total, event.text, event.status, time.monotonic() - t0, event.layer)
        result.steps.append(event)
        report(event)
    assert state is not None
    manifest = ImageManifest(
        name=name,
        layers=state.layers,
        env=state.env,
        workdir=state.workdir,
        user=state.runtime_user,
        created_at=time.time(),
        history=state.history,
        start_cmd=start_cmd,
        ready_cmd=ready_cmd,
    )
    store.put(manifest)
    result.manifest = manifest
    return result


def _lowers(store: ImageStore, state: _State) -> tuple[Path, ...]:
    return tuple(store.layer_tree(d) for d in reversed(state.layers))


def _direct_layer(store: ImageStore, state: _State, text: str, fill: Callable[[Path], object]) -> StepEvent:
    """A layer assembled without a sandbox (COPY, WORKDIR's mkdir), cached by key like any other."""
    t0 = time.monotonic()
    status = "cached"
    if not store.has_layer(state.key):
        staging = store.staging()
        try:
            fill(staging / "tree")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        store.commit_layer(staging, state.key, state.layers[-1] if state.layers else None, text)
        status = "built"
    state.layers.append(state.key)
    return StepEvent(0, 0, text, status, time.monotonic() - t0, layer=state.key)
