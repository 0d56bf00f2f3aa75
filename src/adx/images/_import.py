"""``adx image import``: an OCI image layout (directory or tar) or a ``docker save`` tarball into the store.

Each image layer (a tar, optionally gzip- or zstd-compressed) becomes one store layer, digest
``layer_digest(parent, "IMPORT <the layer's own digest>")``: importing the same image twice, or two images that
share their bottom layers, stores them once. OCI whiteouts are translated to overlayfs's: ``.wh.NAME`` becomes a
0/0 character device ``NAME``, ``.wh..wh..opq`` the ``trusted.overlay.opaque`` xattr on its directory. The image
config's ``Env``, ``WorkingDir`` and ``User`` become the manifest's.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from adx.errors import InvalidInputError
from adx.images._store import ImageManifest, ImageStore, layer_digest

__all__ = ["import_image"]

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"


@dataclass(frozen=True)
class _Source:
    layers: list[tuple[str, Callable[[], IO[bytes]]]]  # (digest or name, opener of the layer tar)
    config: dict[str, Any]


def _bad(reason: str) -> InvalidInputError:
    return InvalidInputError("source", reason)


def _json(opener: Callable[[], IO[bytes]], what: str) -> Any:
    try:
        with opener() as f:
            return json.loads(f.read())
    except (OSError, ValueError, KeyError) as exc:
        raise _bad(f"cannot read {what}: {exc}") from None


@contextlib.contextmanager
def _open_source(path: Path) -> Iterator[Callable[[str], Callable[[], IO[bytes]]]]:
    """A function from a path inside the source (directory or tar) to an opener of that member."""
    if path.is_dir():
        root = path.resolve()

        def in_dir(name: str) -> Callable[[], IO[bytes]]:
            target = (root / name).resolve()
            if root not in target.parents:
                raise _bad(f"{name!r} points outside the image")
            return lambda: open(target, "rb")

        yield in_dir
        return
    try:
        archive = tarfile.open(path)  # noqa: SIM115 - closed below, after every opener ran
    except (OSError, tarfile.TarError) as exc:
        raise _bad(f"{path} is neither a directory nor a readable tar ({exc})") from None
    try:
        members = {m.name.removeprefix("./"): m for m in archive.getmembers()}

        def in_tar(name: str) -> Callable[[], IO[bytes]]:
            member = members.get(name.removeprefix("./"))
            if member is None:
                raise _bad(f"{name!r} is not in {path.name}")

            def open_member() -> IO[bytes]:
                f = archive.extractfile(member)
                if f is None:
                    raise _bad(f"{name!r} is not a file")
                return f

            return open_member

        yield in_tar
    finally:
        archive.close()


def _read_source(open_: Callable[[str], Callable[[], IO[bytes]]]) -> _Source:
    with contextlib.suppress(InvalidInputError):
        entries = _json(open_("manifest.json"), "manifest.json")  # docker save
        if isinstance(entries, list) and entries and "Layers" in entries[0]:
            entry = entries[0]
            config = _json(open_(entry["Config"]), entry["Config"])
            return _Source([(name, open_(name)) for name in entry["Layers"]], config)
    index = _json(open_("index.json"), "index.json (neither an OCI layout nor a docker save tarball)")

    def blob(digest: str) -> Callable[[], IO[bytes]]:
        algo, _, hexa = digest.partition(":")
        return open_(f"blobs/{algo}/{hexa}")

    manifests = index.get("manifests") or []
    if not manifests:
        raise _bad("index.json lists no manifest")
    manifest = _json(blob(manifests[0]["digest"]), "the image manifest")
    if "manifests" in manifest:  # an index of platforms: the first one
        manifest = _json(blob(manifest["manifests"][0]["digest"]), "the platform manifest")
    config = _json(blob(manifest["config"]["digest"]), "the image config")
    return _Source([(layer["digest"], blob(layer["digest"])) for layer in manifest.get("layers", [])], config)


def _decompressed(raw: IO[bytes]) -> IO[bytes]:
    head = raw.read(4)
    rest = raw.read()
    data = head + rest
    if head[:2] == b"\x1f\x8b":
        import gzip

        return io.BytesIO(gzip.decompress(data))
    if head == b"\x28\xb5\x2f\xfd":
        import subprocess

        try:
            out = subprocess.run(["zstd", "-dc"], input=data, capture_output=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            raise _bad(f"a zstd-compressed layer needs the zstd program ({exc})") from None
        return io.BytesIO(out)
    return io.BytesIO(data)


def _safe(name: str) -> PurePosixPath | None:
    parts = [p for p in PurePosixPath(name).parts if p not in ("/", ".")]
    if not parts or ".." in parts:
        return None
    return PurePosixPath(*parts)


def _through_symlink(tree: Path, rel: PurePosixPath) -> bool:
    """True when a directory on the way to ``rel`` inside ``tree`` is a symlink: extracting there would follow
    it on the host (an image's ``etc -> /etc`` then ``etc/passwd`` must never write the host's file)."""
    here = tree
    for part in rel.parent.parts:
        here = here / part
        if here.is_symlink():
            return True
    return False


def _unpack_layer(stream: IO[bytes], tree: Path) -> None:
    """Extract one image layer into ``tree`` as an overlayfs layer (whiteouts translated), owners, modes (setuid
    included: sudo needs it) and xattrs kept. Members that would land outside ``tree`` are refused."""
    with tarfile.open(fileobj=stream, mode="r:") as tar:
        for member in tar:
            rel = _safe(member.name)
            if rel is None:
                continue
            if _through_symlink(tree, rel) or (member.islnk() and _safe(member.linkname) is None):
                raise _bad(f"layer member {member.name!r} would be written through a link outside the layer")
            parent = tree / rel.parent
            base = rel.name
            if base == _OPAQUE:
                parent.mkdir(parents=True, exist_ok=True)
                os.setxattr(parent, "trusted.overlay.opaque", b"y")
                continue
            if base.startswith(_WHITEOUT):
                parent.mkdir(parents=True, exist_ok=True)
                target = parent / base[len(_WHITEOUT) :]
                if target.exists() or target.is_symlink():
                    shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
                os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))
                continue
            member.name = str(rel)
            if member.islnk():
                link = _safe(member.linkname)
                assert link is not None  # checked above
                if _through_symlink(tree, link / "x") or (tree / link).is_symlink():
                    raise _bad(f"hard link {member.name!r} points through a symlink")
                member.linkname = str(link)  # relative to the layer, never the host's root
            existing = tree / rel
            if (existing.is_symlink() or existing.exists()) and not (member.isdir() and existing.is_dir()):
                # A later entry replaces an earlier one (tar semantics); a directory stays and gets new attributes.
                shutil.rmtree(existing) if existing.is_dir() and not existing.is_symlink() else existing.unlink()
            tar.extract(member, tree, set_attrs=True, numeric_owner=True, filter="fully_trusted")


def import_image(
    store: ImageStore, source: Path, name: str, *, progress: Callable[[str], None] | None = None
) -> ImageManifest:
    """Import the image at ``source`` (OCI layout dir or tar, or ``docker save`` tar) as image ``name``."""
    say = progress or (lambda _line: None)
    with _open_source(source) as open_:
        src = _read_source(open_)
        layers: list[str] = []
        parent: str | None = None
        for index, (layer_id, opener) in enumerate(src.layers, 1):
            with opener() as raw:
                data = raw.read()
            own = layer_id if layer_id.startswith("sha256:") else f"sha256:{hashlib.sha256(data).hexdigest()}"
            step = f"IMPORT {own}"
            digest = layer_digest(parent, step)
            if store.has_layer(digest):
                say(f"layer {index}/{len(src.layers)} {own[:19]} cached")
            else:
                t0 = time.monotonic()
                staging = store.staging()
                try:
                    _unpack_layer(_decompressed(io.BytesIO(data)), staging / "tree")
                except BaseException:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise
                store.commit_layer(staging, digest, parent, step)
                say(f"layer {index}/{len(src.layers)} {own[:19]} imported in {time.monotonic() - t0:.1f}s")
            layers.append(digest)
            parent = digest
    cfg = src.config.get("config") or src.config.get("Config") or {}
    env = dict(item.split("=", 1) for item in cfg.get("Env") or [] if "=" in item)
    manifest = ImageManifest(
        name=name,
        layers=layers,
        env=env,
        workdir=cfg.get("WorkingDir") or "/",
        user=user if (user := (cfg.get("User") or "").split(":")[0]) not in ("", "0") else "root",
        created_at=time.time(),
        history=[f"IMPORT {source.name}"],
    )
    store.put(manifest)
    return manifest
