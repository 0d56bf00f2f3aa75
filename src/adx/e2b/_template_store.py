"""Where E2B template builds keep their state: a directory beside the image store (``<images_dir>/e2b-templates``).

Layout (every write is temp + fsync + rename, so a reader on any API replica sees a whole record or the old one)::

    templates/<name>.json            the template: its tenant, resources asked for, its builds (newest last)
    builds/<build id>.json           one build: status, log entries, the reason it failed
    blobs/<sha256>.tar               an uploaded build-context archive, addressed by its own bytes
    uploads/<tenant>/<name>/<hash>   E2B's files hash of a COPY step -> the blob its upload made
    contexts/<sha256>/               a blob unpacked (the COPY steps' sources), made once, then reused

Each build makes an ordinary image of the store, ``<name>--<build>`` (adx.e2b._template_tags); the template's
``default`` tag also names its image ``<name>``, so ``Sandbox.create(name)`` starts it. The layers its COPY steps
make are keyed by the blob's own digest, never by the client's files hash, so one tenant's upload can never stand
in for another's content under the same hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import tarfile
import tempfile
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adx._fs import atomic_write_bytes, atomic_write_json, exclusive_lock, fsync_dir
from adx.errors import InvalidInputError, NotFoundError

__all__ = [
    "BuildRecord",
    "BuildStatus",
    "LogEntry",
    "TagAssignment",
    "TemplateRecord",
    "TemplateStore",
    "process_owner",
]

#: The largest build-context archive one COPY step may upload.
MAX_UPLOAD_BYTES = 2 << 30


class BuildStatus(StrEnum):
    WAITING = "waiting"
    BUILDING = "building"
    READY = "ready"
    ERROR = "error"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


Level = Literal["debug", "info", "warn", "error"]


class LogEntry(_Model):
    """E2B's build log entry (``BuildLogEntry``): ``step`` is E2B's step name (``base``, ``1``.., ``finalize``)."""

    timestamp: float
    level: Level = "info"
    message: str
    step: str | None = None


class BuildReason(_Model):
    message: str
    step: str | None = None


class BuildRecord(_Model):
    id: str
    template: str
    tenant: str
    status: BuildStatus = BuildStatus.WAITING
    created_at: float
    finished_at: float | None = None
    owner: str = Field(description="host:pid of the API process running the build")
    logs: list[LogEntry] = Field(default_factory=list)
    reason: BuildReason | None = None
    tags: list[str] = Field(default_factory=list, description="the tags the build gets once it is ready")
    image: str | None = Field(default=None, description="the image it builds (None: the template's name, as before)")


class TagAssignment(_Model):
    """A tag of a template names one of its builds (E2B's tag assignment)."""

    build: str
    assigned_at: float


class TemplateRecord(_Model):
    name: str
    tenant: str
    created_at: float
    cpu_count: int | None = None
    memory_mb: int | None = None
    builds: list[str] = Field(default_factory=list)
    ready_build: str | None = None
    tags: dict[str, TagAssignment] = Field(default_factory=dict)
    updated_at: float | None = None


def process_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_is_gone(owner: str) -> bool:
    """Whether the API process ``owner`` names has ended (knowable only for a process of this host)."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _tenant_dir(tenant: str) -> str:
    return hashlib.sha256(tenant.encode()).hexdigest()[:32]


class TemplateStore:
    """Synchronous file operations (the routes call them in a worker thread)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.contexts = root / "contexts"

    def _ensure(self, *parts: str) -> Path:
        path = self.root.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Held around read-check-write of templates and builds (API replicas and threads alike: an flock)."""
        with exclusive_lock(self._ensure() / "templates.lock", timeout=30, what="template store lock"):
            yield

    # -- templates and builds -----------------------------------------------------------------------------
    def templates(self) -> list[TemplateRecord]:
        """Every template's record (of every tenant)."""
        folder = self.root / "templates"
        found = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                found.append(TemplateRecord.model_validate_json(path.read_bytes()))
        return found

    def find_template(self, name: str) -> TemplateRecord | None:
        try:
            return TemplateRecord.model_validate_json((self.root / "templates" / f"{name}.json").read_bytes())
        except FileNotFoundError:
            return None

    def put_template(self, record: TemplateRecord) -> None:
        atomic_write_json(self._ensure("templates") / f"{record.name}.json", record.model_dump(mode="json"))

    def remove_template(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / "templates" / f"{name}.json").unlink()

    def get_build(self, build_id: str) -> BuildRecord:
        if not build_id.replace("-", "").isalnum():
            raise NotFoundError(f"build {build_id} not found")
        try:
            return BuildRecord.model_validate_json((self.root / "builds" / f"{build_id}.json").read_bytes())
        except FileNotFoundError:
            raise NotFoundError(f"build {build_id} not found") from None

    def put_build(self, record: BuildRecord) -> None:
        atomic_write_json(self._ensure("builds") / f"{record.id}.json", record.model_dump(mode="json"))

    # -- uploaded files ------------------------------------------------------------------------------------
    def _upload_index(self, tenant: str, template: str, files_hash: str) -> Path:
        return self.root / "uploads" / _tenant_dir(tenant) / template / files_hash

    def uploaded_blob(self, tenant: str, template: str, files_hash: str) -> str | None:
        """The blob digest the tenant's upload for ``files_hash`` made (its archive still there), else None."""
        try:
            digest = self._upload_index(tenant, template, files_hash).read_text().strip()
        except FileNotFoundError:
            return None
        return digest if (self.root / "blobs" / f"{digest}.tar").is_file() else None

    def staging_blob(self) -> tuple[int, Path]:
        """A temporary file beside the blobs to receive an upload (renamed into place by ``commit_blob``)."""
        fd, path = tempfile.mkstemp(prefix=".tmp-", dir=self._ensure("blobs"))
        return fd, Path(path)

    def commit_blob(self, staged: Path, digest: str, tenant: str, template: str, files_hash: str) -> None:
        blobs = self._ensure("blobs")
        os.replace(staged, blobs / f"{digest}.tar")
        fsync_dir(blobs)
        index = self._upload_index(tenant, template, files_hash)
        index.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_bytes(index, digest.encode())

    def unpacked(self, digest: str) -> Path:
        """The blob unpacked under ``contexts/<digest>`` (once; later builds reuse the tree)."""
        target = self.contexts / digest
        if target.is_dir():
            return target
        self._ensure("contexts")
        staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.contexts))
        try:
            with tarfile.open(self.root / "blobs" / f"{digest}.tar", "r:*") as archive:
                # The data filter refuses absolute names, '..', devices and links leaving the tree.
                archive.extractall(staging, filter="data")
            os.rename(staging, target)
        except (tarfile.TarError, OSError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if target.is_dir():  # another build unpacked it meanwhile
                return target
            raise InvalidInputError("files", f"the uploaded archive {digest[:12]} cannot be unpacked: {exc}") from None
        return target

    def sweep_staging(self, older_than: float = 86400.0) -> None:
        """Uploads and unpackings that died midway (a live one renames its own within seconds)."""
        for folder in (self.root / "blobs", self.contexts):
            if not folder.is_dir():
                continue
            for entry in folder.glob(".tmp-*"):
                with contextlib.suppress(OSError):
                    if time.time() - entry.stat().st_mtime > older_than:
                        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
