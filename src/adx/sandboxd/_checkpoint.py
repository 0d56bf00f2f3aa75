"""Filesystem checkpoints: the sandbox's overlay upper layer as a compressed tar plus a manifest.

Artifact directory ``<root>/<checkpoint_id>/``: ``layer.tar.zst`` (or ``.gz`` where zstd is missing) and
``manifest.json`` (kind, source, the sandbox spec, layer file/compression/sha256/size). A capture is written
into ``<root>/.capturing-<owner>-<checkpoint_id>/`` and renamed into place when whole, so an artifact
directory either is complete or does not exist; a delete renames it to ``.deleting-<checkpoint_id>`` first.
What a crash leaves of either is swept by the daemon that owns it (``sweep_partials``). The checkpoint's
*digest* is the sha256 of ``manifest.json``; Restore requires it, verifies the manifest against it and the
layer against the manifest before extracting anything, and extracts from a private copy it verified (not
from the shared path, which could change between check and use).

GNU tar is used (not Python's tarfile) because the upper layer carries overlayfs metadata — whiteouts are
0:0 character devices and opaque directories are ``trusted.overlay.*`` xattrs — which tarfile cannot keep.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypedDict, cast

from adx._fs import atomic_write_bytes, fsync_dir
from adx.errors import ConflictError, InvalidInputError, UnavailableError
from adx.sandboxd._faults import fault

__all__ = [
    "CHECKPOINT_KIND",
    "Manifest",
    "ManifestLayer",
    "capture_layer",
    "deleting_dir",
    "list_artifacts",
    "resolve_location",
    "staging_dir",
    "sweep_partials",
    "verify_and_extract",
]

CHECKPOINT_KIND = "filesystem"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_TAR_FLAGS = ["--xattrs", "--xattrs-include=*", "--numeric-owner", "--sparse"]
_CHUNK = 1 << 20
_CAPTURING = ".capturing-"
# The layer's form (``manifest.layer.form``): ``tar``, the portable compressed tar in the artifact dir, or a
# local checkpoint that is a read-only btrfs snapshot in sandboxd's storage pool (disk_quota = "btrfs"), whose
# manifest names the snapshot and its UUID instead of holding a tar. Its ``compression`` says the same, which
# is all that manifests written before ``form`` existed carry.
TAR = "tar"
SNAPSHOT = "btrfs-snapshot"
_FORMS = (TAR, SNAPSHOT)
_DELETING = ".deleting-"


class ManifestSource(TypedDict):
    sandbox_id: str
    generation: int
    owner: str  # the capturing daemon: only it lists and sweeps the artifact


class ManifestSpec(TypedDict):
    """The checkpointed sandbox's settings a Restore defaults to (JSON forms of its record's fields)."""

    argv: list[str]
    init_argv: list[str]
    execd: Mapping[str, object] | None
    env: dict[str, str]
    cwd: str
    network: Literal["none", "host", "veth"]
    network_policy: Mapping[str, object] | None
    resources: Mapping[str, int]
    metadata: dict[str, str]
    id_base: int | None  # the host IDs the layer's files carry (None: no user namespace)
    image: str | None
    image_layers: list[str] | None
    image_user: str | None


class ManifestBody(TypedDict):
    """What the Checkpoint call writes into ``manifest.json``; capture adds ``format``, ``kind`` and ``layer``.
    Readers take the file as JSON and check what they use (older artifacts lack newer keys)."""

    checkpoint_id: str
    created_at: float
    source: ManifestSource
    spec: ManifestSpec


class ManifestLayer(TypedDict, total=False):
    """Where the artifact's layer is: a compressed tar beside the manifest, or a snapshot in sandboxd's pool.
    Not total: readers take the file as JSON and check what they use (an older artifact has no ``form``: its
    ``compression`` tells)."""

    form: str  # TAR or SNAPSHOT
    file: str  # a tar layer's file name in the artifact dir ("" for a snapshot)
    compression: str  # zstd or gzip (SNAPSHOT for a snapshot)
    sha256: str  # a tar layer's content digest
    size: int
    snapshot: str  # a snapshot layer's name in the pool
    uuid: str  # and the btrfs UUID it must still carry


class Manifest(ManifestBody):
    """``manifest.json`` as captured: the Checkpoint call's body plus what capture adds."""

    format: int  # MANIFEST_FORMAT
    kind: str  # CHECKPOINT_KIND
    layer: ManifestLayer


def _compressor() -> tuple[str, list[str], list[str]]:
    """(name, compress argv, decompress argv); zstd when installed, gzip otherwise."""
    if shutil.which("zstd"):
        return "zstd", ["zstd", "-q", "-1", "-T0", "-c"], ["zstd", "-q", "-d", "-c"]
    return "gzip", ["gzip", "-1", "-c"], ["gzip", "-d", "-c"]


def _decompressor(name: str) -> list[str]:
    if name == "zstd":
        if not shutil.which("zstd"):
            raise UnavailableError("checkpoint needs zstd to decompress, and it is not installed")
        return ["zstd", "-q", "-d", "-c"]
    if name == "gzip":
        return ["gzip", "-d", "-c"]
    raise InvalidInputError("manifest.layer.compression", f"unsupported compression {name!r}")


def resolve_location(location: str, roots: dict[str, Path]) -> Path:
    """The artifact dir, which must lie directly under one of the configured roots."""
    path = Path(location)
    if not path.is_absolute():
        raise InvalidInputError("location", "must be an absolute path")
    resolved = path.resolve()
    for root in roots.values():
        if resolved.parent == root.resolve():
            return resolved
    raise InvalidInputError("location", "is not inside a configured checkpoint root")


def staging_dir(artifact_dir: Path, owner: str) -> Path:
    """Where the daemon ``owner`` writes ``artifact_dir`` before it is whole."""
    return artifact_dir.with_name(f"{_CAPTURING}{owner}-{artifact_dir.name}")


def capture_layer(upper: Path, artifact_dir: Path, manifest_body: ManifestBody, owner: str) -> tuple[str, str, int]:
    """Write layer + manifest into ``artifact_dir`` (created whole, by a rename of its staging dir).

    Returns (manifest digest, layer sha256, size). On failure nothing is left behind."""
    staging = staging_dir(artifact_dir, owner)
    try:
        result = _capture_into(upper, staging, manifest_body)
        os.rename(staging, artifact_dir)
        fsync_dir(artifact_dir.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return result


def _capture_into(upper: Path, artifact_dir: Path, manifest_body: ManifestBody) -> tuple[str, str, int]:
    name, compress, _ = _compressor()
    layer_name = f"layer.tar.{'zst' if name == 'zstd' else 'gz'}"
    artifact_dir.mkdir(mode=0o700)
    layer_path = artifact_dir / layer_name
    digest = hashlib.sha256()
    size = 0
    with open(layer_path, "wb") as out:
        tar = subprocess.Popen(
            ["tar", *_TAR_FLAGS, "-C", str(upper), "-cf", "-", "."],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert tar.stdout is not None
        comp = subprocess.Popen(compress, stdin=tar.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        tar.stdout.close()  # comp owns the pipe now; tar gets SIGPIPE if comp dies
        assert comp.stdout is not None
        while chunk := comp.stdout.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        comp_err = comp.stderr.read() if comp.stderr else b""
        tar_err = tar.stderr.read() if tar.stderr else b""
        if comp.wait() != 0 or tar.wait() != 0:
            raise UnavailableError(
                f"checkpoint capture failed: tar {tar.returncode} {tar_err[-300:]!r}, "
                f"{name} {comp.returncode} {comp_err[-300:]!r}"
            )
        out.flush()
        os.fsync(out.fileno())
    manifest: Manifest = {
        **manifest_body,
        "format": MANIFEST_FORMAT,
        "kind": CHECKPOINT_KIND,
        "layer": {"form": TAR, "file": layer_name, "compression": name, "sha256": digest.hexdigest(), "size": size},
    }
    raw = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    atomic_write_bytes(artifact_dir / MANIFEST, raw, mode=0o600)
    return hashlib.sha256(raw).hexdigest(), digest.hexdigest(), size


def write_snapshot_artifact(
    artifact_dir: Path, manifest_body: ManifestBody, owner: str, snapshot: str, uuid: str, size: int
) -> tuple[str, str, int]:
    """An artifact whose layer is the pool snapshot ``snapshot`` (btrfs UUID ``uuid``): manifest only.

    The manifest's digest pins the UUID, and the restore checks the snapshot still carries it; the snapshot is
    read-only and lives in sandboxd's private pool, so no content hash is taken (that would read every byte,
    which is what this kind exists to avoid). Returns (manifest digest, the UUID, size)."""
    staging = staging_dir(artifact_dir, owner)
    manifest: Manifest = {
        **manifest_body,
        "format": MANIFEST_FORMAT,
        "kind": CHECKPOINT_KIND,
        "layer": {
            "form": SNAPSHOT,
            "file": "",
            "compression": SNAPSHOT,
            "snapshot": snapshot,
            "uuid": uuid,
            "size": size,
        },
    }
    raw = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    try:
        staging.mkdir(mode=0o700)
        atomic_write_bytes(staging / MANIFEST, raw, mode=0o600)
        fault("checkpoint.before_rename")  # a whole manifest in the staging dir is still no artifact
        os.rename(staging, artifact_dir)
        fsync_dir(artifact_dir.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return hashlib.sha256(raw).hexdigest(), uuid, size


def snapshot_of(manifest: Manifest) -> tuple[str, str] | None:
    """(snapshot name, UUID) when the artifact is a pool snapshot, else None (a tar layer)."""
    layer = manifest.get("layer", {})
    if layer.get("form", SNAPSHOT if layer.get("compression") == SNAPSHOT else TAR) != SNAPSHOT:
        return None
    name = str(layer.get("snapshot", ""))
    if not name or "/" in name or name.startswith("."):
        raise InvalidInputError("manifest.layer.snapshot", f"not a snapshot name: {name!r}")
    return name, str(layer.get("uuid", ""))


def list_artifacts(root: Path, owner: str) -> list[tuple[Path, str, Manifest]]:
    """(dir, digest, manifest) of every whole artifact under ``root`` that the daemon ``owner`` captured.

    A shared root holds other daemons' artifacts too; those are never listed (nor swept) here."""
    found: list[tuple[Path, str, Manifest]] = []
    if not root.is_dir():
        return found
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        try:
            raw = (entry / MANIFEST).read_bytes()
            manifest = json.loads(raw)
        except (OSError, ValueError):
            continue  # not an artifact (or one being deleted by its owner right now)
        if isinstance(manifest, dict) and manifest.get("source", {}).get("owner") == owner:
            # A Manifest as far as its readers go: each checks the keys it uses (older artifacts lack newer ones).
            found.append((entry, hashlib.sha256(raw).hexdigest(), cast(Manifest, manifest)))
    return found


def sweep_partials(root: Path, owner: str) -> list[str]:
    """Remove what an interrupted capture of ``owner`` or an interrupted delete left under ``root``.

    Only at daemon start: no capture of this daemon is in flight then. Returns the names removed."""
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((f"{_CAPTURING}{owner}-", _DELETING)) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def deleting_dir(artifact_dir: Path) -> Path:
    return artifact_dir.with_name(f"{_DELETING}{artifact_dir.name}")


def read_manifest(artifact_dir: Path, expected_digest: str) -> Manifest:
    try:
        raw = (artifact_dir / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise InvalidInputError("location", f"no {MANIFEST} in {artifact_dir}") from None
    if hashlib.sha256(raw).hexdigest() != expected_digest.lower():
        raise ConflictError(
            f"checkpoint {artifact_dir}: manifest digest does not match; artifact refused",
            details={"location": str(artifact_dir)},
        )
    manifest: Manifest = json.loads(raw)  # what the checks below and the readers look at is checked there
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("kind") != CHECKPOINT_KIND:
        raise InvalidInputError("location", "unsupported checkpoint format or kind")
    form = manifest.get("layer", {}).get("form", TAR)
    if form not in _FORMS:
        raise InvalidInputError("manifest.layer.form", f"unsupported layer form {form!r} (known: {list(_FORMS)})")
    return manifest


def verify_and_extract(artifact_dir: Path, manifest: Manifest, scratch: Path, upper: Path) -> None:
    """Copy the layer to ``scratch`` while hashing, compare with the manifest, then extract into ``upper``."""
    layer = manifest["layer"]
    name = Path(layer["file"]).name  # never follow a path out of the artifact dir
    digest = hashlib.sha256()
    with open(artifact_dir / name, "rb") as src, open(scratch, "wb") as dst:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
    if digest.hexdigest() != layer["sha256"]:
        with contextlib.suppress(FileNotFoundError):
            scratch.unlink()
        raise ConflictError(
            f"checkpoint {artifact_dir}: layer sha256 does not match its manifest; artifact refused",
            details={"location": str(artifact_dir)},
        )
    decompress = _decompressor(layer["compression"])
    with open(scratch, "rb") as src:
        comp = subprocess.Popen(decompress, stdin=src, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert comp.stdout is not None
        tar = subprocess.run(
            ["tar", *_TAR_FLAGS, "-C", str(upper), "-xpf", "-"],
            stdin=comp.stdout,
            capture_output=True,
            check=False,
        )
        comp.stdout.close()
        comp_err = comp.stderr.read() if comp.stderr else b""
        if comp.wait() != 0 or tar.returncode != 0:
            raise UnavailableError(
                f"checkpoint extract failed: tar {tar.returncode} {tar.stderr[-300:]!r}, {comp_err[-300:]!r}"
            )
    scratch.unlink()


def new_checkpoint_id() -> str:
    return f"ckpt-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{os.urandom(6).hex()}"
