"""The image store: content-addressed read-only layers and named image manifests, on one directory.

Layout under the store root (a node's ``<images_dir>/store``; a directory shared by several nodes works too,
every write is a rename)::

    layers/<digest>/tree/      the layer's files (overlayfs lower dir: whiteouts and opaque dirs kept as is)
    layers/<digest>/layer.json what made it: parent digest, step text, size
    images/<name>.json         manifest: ordered layer digests (bottom first), env, workdir, user
    refs/<holder>.json         layers a live sandbox mounts (sandboxd writes it at create, removes it at delete)
    downloads/                 verified tarballs a build fetched (the Debian image's node and npm: _node_dist.py)
    store.lock                 flock held by commits, removals and garbage collection

A layer's digest is ``sha256(parent digest + the step's canonical text + the digest of any content it copies)``:
the same step on the same parent is the same layer (a cached build step), whoever built it. A layer directory
is complete or absent: it is assembled under ``layers/.tmp-*`` and renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adx._fs import atomic_write_json, exclusive_lock, fsync_dir
from adx.errors import ConflictError, InvalidInputError, NotFoundError

__all__ = ["POOL_HOLDER_PREFIX", "ImageManifest", "ImageStore", "LayerInfo", "layer_digest", "validate_image_name"]

MANIFEST_FORMAT = 1
#: Layer holders with this prefix are sandboxd's warm pool members (sandboxd/_warm_pool.py names them so):
#: pre-started, claimed by no one yet, dropped at will.
POOL_HOLDER_PREFIX = "_warm-"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")


def validate_image_name(name: str, field: str = "image") -> str:
    """Same rule as ``EnvironmentSpec.image``: 1-63 of ``[a-z0-9._-]``, starting with a letter or digit."""
    if not (0 < len(name) <= 63 and set(name) <= _NAME_CHARS and name[0] not in "._-"):
        raise InvalidInputError(
            field, f"{name!r} is not an image name (1-63 lowercase letters, digits, '.', '_' or '-')"
        )
    return name


def layer_digest(parent: str | None, step: str, content: str = "") -> str:
    """The content address of the layer ``step`` makes on ``parent`` (``content``: digest of copied files)."""
    h = hashlib.sha256()
    h.update(f"adx-layer-v1\0{parent or ''}\0{step}\0{content}".encode())
    return h.hexdigest()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LayerInfo(_Model):
    digest: str
    parent: str | None = None
    step: str = Field(description="the canonical step text the digest covers")
    size_bytes: int = 0
    created_at: float = 0.0


class ImageManifest(_Model):
    format: int = MANIFEST_FORMAT
    name: str
    layers: list[str] = Field(description="layer digests, bottom (first) to top")
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str = "/"
    user: str = "root"
    created_at: float = 0.0
    history: list[str] = Field(default_factory=list, description="the steps that made it, in order")
    start_cmd: str | None = Field(default=None, description="E2B template: the command its sandboxes start with")
    ready_cmd: str | None = Field(default=None, description="E2B template: exits 0 once the start command is ready")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_image_name(value, "name")


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def move_tree(src: Path, dst: Path) -> None:
    """Move a layer tree keeping owners, modes, device nodes (overlay whiteouts) and xattrs (opaque dirs):
    a rename on one filesystem, else ``cp -a`` (which keeps all of them) then removal of the source."""
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno != 18:  # EXDEV: another filesystem (a btrfs upper layer, a shared store)
            raise
        subprocess.run(["cp", "-a", "--", str(src), str(dst)], check=True, capture_output=True)
        shutil.rmtree(src, ignore_errors=True)


class ImageStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.layers_dir = root / "layers"
        self.images_dir = root / "images"
        self.refs_dir = root / "refs"

    def ensure(self) -> ImageStore:
        for d in (self.root, self.layers_dir, self.images_dir, self.refs_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o755)
        return self

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.ensure()
        with exclusive_lock(self.root / "store.lock", timeout=120, what="image store lock"):
            yield

    # -- layers -------------------------------------------------------------------------------------------
    def layer_tree(self, digest: str) -> Path:
        return self.layers_dir / digest / "tree"

    def has_layer(self, digest: str) -> bool:
        return (self.layers_dir / digest / "layer.json").is_file()

    def layer_info(self, digest: str) -> LayerInfo:
        try:
            return LayerInfo.model_validate_json((self.layers_dir / digest / "layer.json").read_bytes())
        except FileNotFoundError:
            raise NotFoundError(f"layer {digest} is not in the image store", details={"layer": digest}) from None

    def staging(self, tag: str = "") -> Path:
        """A fresh directory to assemble a layer in (its ``tree`` is the layer's root), on the store's filesystem;
        named ``.tmp-<tag>*`` (a pull tags its own with its PID, so a later one can remove a killed one's)."""
        self.ensure()
        path = Path(tempfile.mkdtemp(prefix=f".tmp-{tag}", dir=self.layers_dir))
        (path / "tree").mkdir(mode=0o755)
        return path

    def commit_layer(self, staging: Path, digest: str, parent: str | None, step: str) -> LayerInfo:
        """Rename an assembled ``staging`` dir into place as layer ``digest`` (a layer already there wins: the
        same digest is the same content; the staging copy is dropped)."""
        info = LayerInfo(
            digest=digest, parent=parent, step=step, size_bytes=_tree_size(staging / "tree"), created_at=time.time()
        )
        atomic_write_json(staging / "layer.json", info.model_dump(), mode=0o644)
        os.chmod(staging, 0o755)
        target = self.layers_dir / digest
        with self.locked():
            if self.has_layer(digest):
                shutil.rmtree(staging, ignore_errors=True)
                return self.layer_info(digest)
            if target.exists():  # a crash between a rename and its layer.json cannot happen; debris can
                shutil.rmtree(target)
            os.rename(staging, target)
            fsync_dir(self.layers_dir)
        return info

    def lowerdir_of(self, layers: list[str]) -> str:
        """overlayfs ``lowerdir=`` for ``layers`` (bottom first): the topmost first, colon-joined."""
        return ":".join(str(self.layer_tree(d)) for d in reversed(layers))

    def commit_tree(self, tree: Path, digest: str, parent: str | None, step: str) -> LayerInfo:
        """Move a finished directory tree (e.g. an ended build sandbox's upper layer) in as layer ``digest``."""
        staging = self.staging()
        try:
            (staging / "tree").rmdir()
            move_tree(tree, staging / "tree")
            return self.commit_layer(staging, digest, parent, step)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    # -- images -------------------------------------------------------------------------------------------
    def _manifest_path(self, name: str) -> Path:
        return self.images_dir / f"{validate_image_name(name)}.json"

    def get(self, name: str, field: str = "image") -> ImageManifest:
        try:
            data = self._manifest_path(name).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(
                f"{field}: no image named {name!r} (adx image list shows the images)",
                details={"field": field, "image": name},
            ) from None
        return ImageManifest.model_validate_json(data)

    def find(self, name: str) -> ImageManifest | None:
        try:
            return self.get(name)
        except NotFoundError:
            return None

    def put(self, manifest: ImageManifest) -> None:
        missing = [d for d in manifest.layers if not self.has_layer(d)]
        if missing:
            raise InvalidInputError("layers", f"image {manifest.name}: layers not in the store: {missing}")
        with self.locked():
            atomic_write_json(self._manifest_path(manifest.name), manifest.model_dump(), mode=0o644)

    def list_images(self) -> list[ImageManifest]:
        if not self.images_dir.is_dir():
            return []
        out = []
        for path in sorted(self.images_dir.glob("*.json")):
            with contextlib.suppress(ValueError, OSError):
                out.append(ImageManifest.model_validate_json(path.read_bytes()))
        return out

    def rm(self, name: str, *, force: bool = False) -> list[str]:
        """Remove image ``name``; then garbage-collect. Refused while a live sandbox mounts one of its layers
        (``force``: remove the name anyway; its layers stay until no sandbox holds them). A warm pool's members
        (holders named ``POOL_HOLDER_PREFIX``...) are nobody's sandboxes: they do not refuse the removal, and
        their layers stay until the pool drops them. Returns the layers removed."""
        manifest = self.get(name)
        with self.locked():
            holders = sorted(
                h
                for h, layers in self._refs().items()
                if set(layers) & set(manifest.layers) and not h.startswith(POOL_HOLDER_PREFIX)
            )
            if not force and holders:
                raise ConflictError(
                    f"image {name} is used by live sandboxes ({', '.join(holders)}); delete them or use --force",
                    details={"image": name, "sandboxes": holders},
                )
            self._manifest_path(name).unlink()
            fsync_dir(self.images_dir)
        return self.gc()

    # -- references and garbage collection ----------------------------------------------------------------
    def _refs(self) -> dict[str, list[str]]:
        refs: dict[str, list[str]] = {}
        if self.refs_dir.is_dir():
            for path in self.refs_dir.glob("*.json"):
                with contextlib.suppress(ValueError, OSError):
                    refs[path.stem] = list(json.loads(path.read_bytes()))
        return refs

    def held_layers(self) -> set[str]:
        return {d for layers in self._refs().values() for d in layers}

    def hold(self, holder: str, layers: Iterable[str]) -> None:
        """Record that ``holder`` (a sandbox ID) mounts ``layers``: no removal or GC takes them meanwhile."""
        self.ensure()
        atomic_write_json(self.refs_dir / f"{holder}.json", list(layers), mode=0o644)

    def move_hold(self, holder: str, new_holder: str) -> bool:
        """``holder``'s reference becomes ``new_holder``'s (a warm member's, at its claim): a rename and one
        directory fsync, where a fresh :meth:`hold` writes and fsyncs a file too. False: ``holder`` held nothing."""
        try:
            os.rename(self.refs_dir / f"{holder}.json", self.refs_dir / f"{new_holder}.json")
        except FileNotFoundError:
            return False
        fsync_dir(self.refs_dir)
        return True

    def release(self, holder: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.refs_dir / f"{holder}.json").unlink()

    def release_all_but(self, live: set[str]) -> None:
        """Drop references of holders that no longer exist (a sandbox deleted while its daemon was down)."""
        for holder in self._refs():
            if holder not in live:
                self.release(holder)

    def gc(self) -> list[str]:
        """Remove layers no image manifest names and no live sandbox holds, and leftover staging dirs."""
        removed: list[str] = []
        with self.locked():
            wanted = {d for m in self.list_images() for d in m.layers} | self.held_layers()
            for entry in sorted(self.layers_dir.iterdir()):
                if entry.name.startswith(".tmp-"):
                    # Staging dirs older than a day belong to builds that died (a live build renames its own).
                    if time.time() - entry.stat().st_mtime > 86400:
                        shutil.rmtree(entry, ignore_errors=True)
                    continue
                if entry.name not in wanted:
                    # Rename first: a half-removed layer never keeps its digest name.
                    doomed = self.layers_dir / f".tmp-rm-{entry.name}"
                    os.rename(entry, doomed)
                    shutil.rmtree(doomed, ignore_errors=True)
                    removed.append(entry.name)
            if removed:
                fsync_dir(self.layers_dir)
        return removed
