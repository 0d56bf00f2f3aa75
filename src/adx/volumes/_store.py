"""The volume store: a tenant's named volume is a directory under the volume root, its record beside its data.

Layout (``<root>`` is the API's and nodes' ``volumes_dir``: a node's state dir, or the shared storage every node
and API replica mounts)::

    <root>/<tenant>/<name>/volume.json    the record (id, name, createdAt): written once, before the name exists
    <root>/<tenant>/<name>/data/          the files; what sandboxd bind-mounts (volume_data_dir)
    <root>/<tenant>/.ids/<id> -> ../<name>  the ID index (a symlink: one atomic syscall to make or drop)
    <root>/<tenant>/.new-<id>/ .gone-<id>/  a create being staged, a delete being removed (never listed)

Why on the store and not in Redis: the data has to be on this filesystem anyway (the API serves its files, nodes
mount it), so a record kept beside it can never name a volume whose directory is missing or the reverse, and
every API replica that can serve the files also sees the same records. Each change is one atomic step: a create
stages the whole volume and ``rename``s it onto its name (refused when the name exists: a live volume's
directory is never empty), a delete ``rename``s it out of the way first; a crash leaves a staging or trash
directory that is never listed and is swept by the next create of that tenant.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from pathlib import Path

from adx._fs import atomic_write_bytes, fsync_dir
from adx.errors import ConflictError, InvalidInputError, NotFoundError
from adx.model import VOLUME, Volume, check_volume_name, volume_data_dir
from adx.model._ids import new_id
from adx.model._volumes import tenant_dir_name

__all__ = ["DATA_GID", "DATA_UID", "VolumeStore"]

RECORD = "volume.json"
IDS = ".ids"
STAGING = ".new-"
TRASH = ".gone-"
#: Owner of a new volume's top directory (and the default of files the content API writes): E2B's ``user``
#: (uid/gid 1000 inside every sandbox; sandboxd's idmapped mount shows on-disk IDs unshifted).
DATA_UID = DATA_GID = 1000
#: A leftover staging dir older than this is a crashed create's, not a create under way.
STALE_SECONDS = 3600.0


class VolumeStore:
    """Synchronous file operations (callers on an event loop run them in a thread)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _tenant_dir(self, tenant: str) -> Path:
        return self.root / tenant_dir_name(tenant)

    def data_dir(self, volume: Volume) -> Path:
        return volume_data_dir(self.root, volume.tenant, volume.name)

    def create(self, tenant: str, name: str) -> Volume:
        try:
            check_volume_name(name)
        except ValueError as exc:
            raise InvalidInputError("name", str(exc)) from None
        tdir = self._tenant_dir(tenant)
        # 0700 down to the tenant: host users other than root never reach a volume's files (the API and
        # sandboxd run as root; a sandbox sees only the mounted data dir, whatever the modes above it).
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tdir.mkdir(exist_ok=True, mode=0o700)
        (tdir / IDS).mkdir(exist_ok=True, mode=0o700)
        self._sweep(tdir)
        volume = Volume(id=new_id(VOLUME), tenant=tenant, name=name, created_at=time.time())
        staging = tdir / f"{STAGING}{volume.id}"
        staging.mkdir(mode=0o755)
        try:
            atomic_write_bytes(staging / RECORD, volume.model_dump_json(by_alias=True).encode(), mode=0o644)
            (staging / "data").mkdir(mode=0o755)
            os.chown(staging / "data", DATA_UID, DATA_GID)
            fsync_dir(staging)
            link = tdir / IDS / volume.id
            os.symlink(f"../{name}", link)
            try:
                os.rename(staging, tdir / name)
            except OSError as exc:
                os.unlink(link)
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise ConflictError(
                        f"name: a volume named {name!r} exists", details={"field": "name", "name": name}
                    ) from None
                raise
            fsync_dir(tdir)
            fsync_dir(tdir / IDS)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return volume

    def _sweep(self, tdir: Path) -> None:
        """Remove what crashed creates and deletes left behind (best effort)."""
        now = time.time()
        for entry in tdir.iterdir():
            gone = entry.name.startswith(TRASH)
            stale = entry.name.startswith(STAGING) and now - entry.stat().st_mtime > STALE_SECONDS
            if gone or stale:
                shutil.rmtree(entry, ignore_errors=True)

    def _read(self, tdir: Path, name: str) -> Volume | None:
        try:
            return Volume.model_validate_json((tdir / name / RECORD).read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            return None

    def list(self, tenant: str) -> list[Volume]:
        """The tenant's volumes, oldest first."""
        tdir = self._tenant_dir(tenant)
        if not tdir.is_dir():
            return []
        found = [self._read(tdir, e.name) for e in os.scandir(tdir) if not e.name.startswith(".")]
        return sorted((v for v in found if v is not None), key=lambda v: (v.created_at, v.id))

    def get(self, tenant: str, volume_id: str) -> Volume:
        tdir = self._tenant_dir(tenant)
        missing = NotFoundError(f"volume {volume_id} not found", details={"volume_id": volume_id})
        if not volume_id.startswith(f"{VOLUME}-") or "/" in volume_id or len(volume_id) > 64:
            raise missing
        try:
            target = os.readlink(tdir / IDS / volume_id)
        except OSError:
            raise missing from None
        volume = self._read(tdir, os.path.basename(target))
        if volume is None or volume.id != volume_id:
            raise missing
        return volume

    def find(self, tenant: str, name: str) -> Volume | None:
        """The tenant's volume called ``name`` (None: there is none)."""
        try:
            check_volume_name(name)
        except ValueError:
            return None
        return self._read(self._tenant_dir(tenant), name)

    def delete(self, tenant: str, volume_id: str) -> Volume:
        """Remove the volume and its files (the caller checked it is not in use). NotFoundError when missing."""
        volume = self.get(tenant, volume_id)
        tdir = self._tenant_dir(tenant)
        trash = tdir / f"{TRASH}{volume.id}"
        try:
            os.rename(tdir / volume.name, trash)  # the name is free from here on
        except FileNotFoundError:
            raise NotFoundError(f"volume {volume_id} not found", details={"volume_id": volume_id}) from None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tdir / IDS / volume.id)
        fsync_dir(tdir)
        shutil.rmtree(trash, ignore_errors=True)
        return volume
