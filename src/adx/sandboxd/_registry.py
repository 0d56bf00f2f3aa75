"""The persistent registry of sandboxd: a private directory, validated before anything is changed.

Layout (``state_dir``, mode 0700)::

    daemon.lock            exclusive flock of the running daemon (SBX-3)
    owner.json             {"format": 1, "owner": "<uuid>"}  — the native ownership marker
    registry.json          v2 header {"version": 2, "owner": "<uuid>"} — activates the per-sandbox tree
    sandboxes.json         v1 snapshot (legacy; authoritative only until the v2 header is activated)
    sandboxes/<id>/        record.json (owner envelope), lifecycle.lock, native.json, exit.json,
                           upper/ ovlwork/ rootfs/ run/, and after delete only tombstone.json + lifecycle.lock

Every write is temp + fsync + rename + fsync(dir) (``adx._fs.atomic_write_json``). A failed or uncertain
write sets the storage-failed flag: all later registry access is refused until a restart re-reads the disk
(SBX-13). Validation (``load``) only reads; it refuses corrupt, oversized or incompatible content, a v1 file
with records but no owner marker and a v2 header without one (SBX-9), and never falls back from an
activated v2 tree to v1 (SBX-14).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

from pydantic import ValidationError

from adx._fs import atomic_write_json, fsync_dir
from adx.errors import AdxError, UnavailableError, UncertainOutcomeError
from adx.sandboxd import _linux as lx
from adx.sandboxd._models import SANDBOX_ID_RE, ExitStatus, NativeIdentity, Resources, SandboxRecord
from adx.sandboxd._sandbox_layout import EXIT_FILE, LOCK_FILE, NATIVE_FILE, RECORD_FILE, TOMBSTONE_FILE

__all__ = ["LoadedRegistry", "Registry", "RegistryError", "Tombstone"]

OWNER_FILE = "owner.json"
HEADER_FILE = "registry.json"
V1_FILE = "sandboxes.json"
SANDBOXES_DIR = "sandboxes"
RECORD_TEMP = f".{RECORD_FILE}.tmp"
SPARE_PREFIX = ".spare-"  # spare sandbox dirs (Registry.make_spare); never an ID (SANDBOX_ID_RE)
WARM_DIR_PREFIX = ".warm-"  # warm pool members' dirs (_warm_pool); never an ID either, removed at restart too
REGISTRY_VERSION = 2
_KEEP_AFTER_RECLAIM = frozenset({TOMBSTONE_FILE, LOCK_FILE})


def _ignore_missing(func: Any, path: str, exc_info: Any) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


class RegistryError(AdxError):
    """The registry on disk cannot be used as is; the daemon refuses to start and changes nothing."""

    code = "registry_refused"


class RegistryHeader(TypedDict):
    """``registry.json``: activates the v2 tree of per-sandbox records for ``owner``."""

    version: int
    owner: str


class TombstoneExtra(TypedDict, total=False):
    """What a delete adds to a tombstone: what its reclaim needs once the record is gone."""

    reason: str
    cgroup: str  # 'ours', 'vanished' or 'replaced' at delete time
    id_base: int | None  # its user namespace's ID slice stays taken until reclaimed
    native_name: str | None  # a claimed warm member's cgroup/veth name


class TombstoneFile(TombstoneExtra, total=False):
    """``tombstone.json`` (an ID is never reused). Older or startup-written ones lack the delete's keys."""

    sandbox_id: str
    generation: int
    owner: str
    resources: Mapping[str, int]
    deleted_at: float
    native: Mapping[str, object] | None


@dataclass(frozen=True)
class Tombstone:
    sandbox_id: str
    generation: int
    resources: Resources
    deleted_at: float
    data: TombstoneFile


@dataclass
class LoadedRegistry:
    """Everything read and validated from the state dir, before any change."""

    owner: str | None
    header: RegistryHeader | None
    v1_records: list[SandboxRecord]
    records: dict[str, SandboxRecord] = field(default_factory=dict)
    tombstones: dict[str, Tombstone] = field(default_factory=dict)
    uncommitted: list[str] = field(default_factory=list)  # id dirs without record or tombstone


def _read_json(path: Path, max_bytes: int) -> Any:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size > max_bytes:
        raise RegistryError(f"{path}: {size} bytes is larger than the limit of {max_bytes}; refusing to start")
    raw = path.read_bytes()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise RegistryError(f"{path}: corrupt or truncated JSON ({exc}); refusing to start") from None


def _parse_owner(value: Any, path: Path) -> str:
    if not isinstance(value, dict) or value.get("format") != 1 or not isinstance(value.get("owner"), str):
        raise RegistryError(f"{path}: not a valid owner marker; refusing to start")
    try:
        uuid.UUID(value["owner"])
    except ValueError:
        raise RegistryError(f"{path}: owner {value['owner']!r} is not a UUID; refusing to start") from None
    owner: str = value["owner"]
    return owner


def _parse_record(raw: Any, path: Path, owner: str, sandbox_id: str) -> SandboxRecord:
    if not isinstance(raw, dict) or raw.get("format") != REGISTRY_VERSION:
        raise RegistryError(f"{path}: not a v{REGISTRY_VERSION} record envelope; refusing to start")
    if raw.get("owner") != owner:
        raise RegistryError(f"{path}: owner {raw.get('owner')!r} differs from the registry owner; refusing to start")
    try:
        record = SandboxRecord.model_validate(raw.get("record"))
    except ValidationError as exc:
        raise RegistryError(f"{path}: invalid record ({exc.errors()[0]['msg']}); refusing to start") from None
    if record.sandbox_id != sandbox_id:
        raise RegistryError(f"{path}: record names {record.sandbox_id!r}, not its directory; refusing to start")
    return record


def _parse_tombstone(raw: Any, path: Path, sandbox_id: str) -> Tombstone:
    try:
        if not isinstance(raw, dict) or raw["sandbox_id"] != sandbox_id:
            raise KeyError("sandbox_id")
        return Tombstone(
            sandbox_id=sandbox_id,
            generation=int(raw["generation"]),
            resources=Resources.model_validate(raw["resources"]),
            deleted_at=float(raw["deleted_at"]),
            data=cast(TombstoneFile, raw),  # the keys read above are checked; the rest is read with .get
        )
    except (KeyError, TypeError, ValueError, ValidationError):
        raise RegistryError(f"{path}: invalid tombstone; refusing to start") from None


class Registry:
    def __init__(self, state_dir: Path, max_record_bytes: int) -> None:
        self.dir = state_dir
        self.sandboxes_dir = state_dir / SANDBOXES_DIR
        self.max_bytes = max_record_bytes
        self.owner: str = ""
        self.storage_failed: str | None = None
        self._lock = threading.Lock()

    # -- startup ----------------------------------------------------------------------------------
    def load(self) -> LoadedRegistry:
        """Read and validate everything. Raises RegistryError; writes nothing."""
        owner_raw = _read_json(self.dir / OWNER_FILE, self.max_bytes)
        owner = _parse_owner(owner_raw, self.dir / OWNER_FILE) if owner_raw is not None else None
        header = _read_json(self.dir / HEADER_FILE, self.max_bytes)
        v1 = _read_json(self.dir / V1_FILE, self.max_bytes)
        loaded = LoadedRegistry(owner=owner, header=None, v1_records=[])
        if header is not None:
            if not isinstance(header, dict) or header.get("version") != REGISTRY_VERSION:
                raise RegistryError(f"{self.dir / HEADER_FILE}: unsupported registry header; refusing to start")
            if owner is None:
                # SBX-9: the header activates private per-sandbox records; an empty-looking map proves nothing.
                raise RegistryError(
                    f"{self.dir / HEADER_FILE}: v2 registry header without {OWNER_FILE}; restore the original "
                    "ownership state (markers are never fabricated); refusing to start"
                )
            if header.get("owner") != owner:
                raise RegistryError(f"{self.dir / HEADER_FILE}: owner differs from {OWNER_FILE}; refusing to start")
            loaded.header = cast(RegistryHeader, header)  # version and owner checked above
            self._load_tree(loaded, owner)
            return loaded  # SBX-14: an activated v2 tree never falls back to v1
        if v1 is not None:
            loaded.v1_records = self._parse_v1(v1, owner)
        if self.sandboxes_dir.exists() and any(not p.name.startswith(".") for p in self.sandboxes_dir.iterdir()):
            raise RegistryError(
                f"{self.sandboxes_dir}: per-sandbox records exist but no v2 header activates them; refusing to start"
            )
        return loaded

    def _parse_v1(self, v1: Any, owner: str | None) -> list[SandboxRecord]:
        path = self.dir / V1_FILE
        if not isinstance(v1, dict) or v1.get("version") != 1 or not isinstance(v1.get("sandboxes"), dict):
            raise RegistryError(f"{path}: not a v1 registry; refusing to start")
        entries = v1["sandboxes"]
        if entries and owner is None:
            raise RegistryError(
                f"{path}: v1 registry has {len(entries)} record(s) but no {OWNER_FILE} marker: it may still own "
                "live sandboxes of the previous runtime. Delete them through that runtime (or use a fresh state "
                "dir); never delete entries or fabricate the marker. Refusing to start"
            )
        out = []
        for sandbox_id, value in entries.items():
            try:
                rec = SandboxRecord.model_validate(value)
            except ValidationError as exc:
                raise RegistryError(f"{path}: invalid v1 record {sandbox_id!r}: {exc.errors()[0]['msg']}") from None
            if rec.sandbox_id != sandbox_id:
                raise RegistryError(f"{path}: v1 record key {sandbox_id!r} names {rec.sandbox_id!r}")
            out.append(rec)
        return out

    def _load_tree(self, loaded: LoadedRegistry, owner: str) -> None:
        if not self.sandboxes_dir.is_dir():
            raise RegistryError(f"{self.sandboxes_dir}: missing from an activated registry; refusing to start")
        for entry in sorted(self.sandboxes_dir.iterdir()):
            if entry.name.startswith("."):
                continue
            if not entry.is_dir() or not SANDBOX_ID_RE.match(entry.name):
                raise RegistryError(f"{entry}: unexpected entry in the registry; refusing to start")
            tomb_raw = _read_json(entry / TOMBSTONE_FILE, self.max_bytes)
            if tomb_raw is not None:
                loaded.tombstones[entry.name] = _parse_tombstone(tomb_raw, entry / TOMBSTONE_FILE, entry.name)
                continue
            rec_raw = _read_json(entry / RECORD_FILE, self.max_bytes)
            if rec_raw is None:
                # mkdir happened, the record commit did not: nothing native was started (the supervisor
                # starts only a committed record), so the ID is merely blocked.
                loaded.uncommitted.append(entry.name)
                continue
            loaded.records[entry.name] = _parse_record(rec_raw, entry / RECORD_FILE, owner, entry.name)

    def initialize(self, loaded: LoadedRegistry) -> None:
        """Create or migrate storage (after validation): owner marker, records, then activate the v2 header."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if loaded.header is not None:
            assert loaded.owner is not None
            self.owner = loaded.owner
            for sandbox_id in loaded.uncommitted:
                self._write_tombstone_raw(
                    sandbox_id,
                    {
                        "sandbox_id": sandbox_id,
                        "generation": 0,
                        "resources": {"cpu_millis": 0, "memory_bytes": 0, "pids_max": 0, "disk_bytes": 0},
                        "deleted_at": time.time(),
                        "reason": "create interrupted before its record was committed",
                    },
                )
            return
        owner = loaded.owner
        if owner is None:
            owner = str(uuid.uuid4())
            atomic_write_json(self.dir / OWNER_FILE, {"format": 1, "owner": owner})
        self.owner = owner
        self.sandboxes_dir.mkdir(mode=0o700, exist_ok=True)
        for rec in loaded.v1_records:
            # The v1 snapshot stays authoritative until the header below is activated; a crash before that
            # re-runs this migration from v1 (the half-written tree is not activated, so it is rewritten).
            sdir = self.sandboxes_dir / rec.sandbox_id
            sdir.mkdir(mode=0o700, exist_ok=True)
            self._write_record_raw(sdir, rec)
            loaded.records[rec.sandbox_id] = rec
        fsync_dir(self.sandboxes_dir)
        atomic_write_json(self.dir / HEADER_FILE, {"version": REGISTRY_VERSION, "owner": owner})
        if loaded.v1_records:
            # Activated: the v1 file is history now; keep it for operators under a name nobody reads.
            os.replace(self.dir / V1_FILE, self.dir / (V1_FILE + ".migrated"))
            fsync_dir(self.dir)

    # -- writes -----------------------------------------------------------------------------------
    def check_usable(self) -> None:
        if self.storage_failed is not None:
            raise UnavailableError(
                f"sandboxd registry storage failed ({self.storage_failed}); refusing registry access until "
                "sandboxd restarts and reconciles",
                details={"storage_failed": True},
            )

    def _fail(self, what: str, exc: OSError, sandbox_id: str) -> UncertainOutcomeError:
        with self._lock:
            self.storage_failed = f"{what} {sandbox_id}: {exc}"
        return UncertainOutcomeError(
            f"registry commit of {what} for sandbox {sandbox_id} failed or is uncertain: {exc}; "
            "registry access is refused until sandboxd restarts",
            details={"sandbox_id": sandbox_id, "storage_failed": True},
        )

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.sandboxes_dir / sandbox_id

    def _write_record_raw(self, sdir: Path, record: SandboxRecord) -> None:
        envelope = {"format": REGISTRY_VERSION, "owner": self.owner, "record": record.model_dump(mode="json")}
        atomic_write_json(sdir / RECORD_FILE, envelope)

    def make_spare(self, names: list[str], files: list[str], name: str | None = None) -> tuple[Path, int]:
        """A spare sandbox dir (``.spare-*``, with the subdirs ``names``, the empty files ``files`` and its
        lifecycle lock, held: the descriptor) that :meth:`reserve_dir` renames into place, so a create does not
        pay for these mkdirs and file creations (a new inode costs ~0.1-0.3 ms here; an open, microseconds).

        Never a record and never seen by a supervisor; a restart removes any left over (:meth:`remove_spares`).
        ``name``: a warm pool member's dir (``.warm-*``; its supervisor does see it, parked on the lock).
        """
        path = self.sandboxes_dir / (name or f"{SPARE_PREFIX}{secrets.token_hex(8)}")
        path.mkdir(mode=0o700)
        try:
            for name in names:
                # "upper": its mode is the sandbox's "/" (the sandbox dir itself stays 0700).
                (path / name).mkdir(mode=0o755 if name in ("run", "upper") else 0o700)
            for name in files:
                os.close(os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
            lock_fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
            raise
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a new file: nobody else holds it
        return path, lock_fd

    def remove_spares(self) -> None:
        """Spare dirs and warm pool members' dirs left by an earlier run (at startup, under the daemon lock;
        a member's parked supervisor, finding no claim once the lock is free, ends its init and exits)."""
        if self.sandboxes_dir.is_dir():
            for entry in self.sandboxes_dir.iterdir():
                if entry.name.startswith(SPARE_PREFIX):
                    shutil.rmtree(entry)
                elif entry.name.startswith(WARM_DIR_PREFIX):  # its parked supervisor may still be exiting
                    shutil.rmtree(entry, ignore_errors=True)

    def reserve_dir(self, sandbox_id: str, spare: Path | None = None) -> Path:
        """A new sandbox's dir, made or renamed from ``spare`` (FileExistsError proves the ID was used before:
        tombstones keep dirs).

        Not durable and holds no record yet: a restart finds it *uncommitted* and blocks the ID (a tombstone).
        """
        self.check_usable()
        sdir = self.sandbox_dir(sandbox_id)
        if spare is None:
            sdir.mkdir(mode=0o700)
        else:
            lx.rename_noreplace(str(spare), str(sdir))
        return sdir

    def commit_created(self, record: SandboxRecord, before_rename: Callable[[], None] | None = None) -> None:
        """The new sandbox's record, whole (temp, fsync, rename); :meth:`sync_created` must follow before anyone
        is told.

        The two directory fsyncs that make the new entries durable are left to ``sync_created``, so they can
        overlap the sandbox's start: they matter only for a host crash, which ends the sandbox too, and until
        they are done a crash leaves either no record or a whole one, never a torn one.
        """
        # A fresh dir: the temp file is absent or the empty one a spare dir brought (Registry.make_spare).
        self._install_record(record, before_rename, sync_dir=False)

    def _install_record(self, record: SandboxRecord, before_rename: Callable[[], None] | None, sync_dir: bool) -> None:
        """Temp file (fsync'd), the hook, rename over the record, and (``sync_dir``) the directory's fsync."""
        self.check_usable()
        sdir = self.sandbox_dir(record.sandbox_id)
        try:
            tmp = self._write_temp_record(record)
            if before_rename is not None:
                before_rename()
            os.replace(tmp, sdir / RECORD_FILE)
            if sync_dir:
                fsync_dir(sdir)
        except OSError as exc:
            raise self._fail("record", exc, record.sandbox_id) from exc

    def _write_temp_record(self, record: SandboxRecord) -> Path:
        """The record's envelope in its temp file (truncated first), fsync'd; the caller renames it."""
        envelope = {"format": REGISTRY_VERSION, "owner": self.owner, "record": record.model_dump(mode="json")}
        tmp = self.sandbox_dir(record.sandbox_id) / RECORD_TEMP
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            data = memoryview(json.dumps(envelope, indent=2, sort_keys=True).encode() + b"\n")
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def sync_created(self, sandbox_id: str) -> None:
        """Make :meth:`create`'s entries durable: the record's, then the dir's that blocks the ID's reuse."""
        try:
            fsync_dir(self.sandbox_dir(sandbox_id))
            fsync_dir(self.sandboxes_dir)
        except OSError as exc:
            raise self._fail("record", exc, sandbox_id) from exc

    def put(self, record: SandboxRecord) -> None:
        self.check_usable()
        try:
            self._write_record_raw(self.sandbox_dir(record.sandbox_id), record)
        except OSError as exc:
            raise self._fail("record", exc, record.sandbox_id) from exc

    def replace_record(self, record: SandboxRecord, before_rename: Callable[[], None] | None = None) -> None:
        """:meth:`put` with a hook between the temp file's fsync and its rename (a test fault point): a crash
        there leaves the old record in place and a temp file the next write truncates."""
        self._install_record(record, before_rename, sync_dir=True)

    def _write_tombstone_raw(self, sandbox_id: str, data: TombstoneFile) -> None:
        atomic_write_json(self.sandbox_dir(sandbox_id) / TOMBSTONE_FILE, data)

    def write_tombstone(self, record: SandboxRecord, extra: TombstoneExtra) -> Tombstone:
        self.check_usable()
        data: TombstoneFile = {
            "sandbox_id": record.sandbox_id,
            "generation": record.generation,
            "owner": self.owner,
            "resources": record.resources.model_dump(mode="json"),
            "deleted_at": time.time(),
            "native": record.native.model_dump(mode="json") if record.native else None,
            **extra,
        }
        try:
            self._write_tombstone_raw(record.sandbox_id, data)
        except OSError as exc:
            raise self._fail("tombstone", exc, record.sandbox_id) from exc
        return Tombstone(record.sandbox_id, record.generation, record.resources, data["deleted_at"], data)

    def reclaim(self, sandbox_id: str) -> None:
        """Remove everything but the tombstone and the lock (idempotent: an interrupted reclaim continues).

        Removes the secret-bearing record last, so a reclaim interrupted midway still names its owner.
        """
        sdir = self.sandbox_dir(sandbox_id)
        entries = sorted(sdir.iterdir(), key=lambda p: p.name == RECORD_FILE)
        for entry in entries:
            if entry.name in _KEEP_AFTER_RECLAIM:
                continue
            if entry.is_dir() and not entry.is_symlink():
                # The overlay work dir holds a mode-000 "work" dir; as root rmtree handles it.
                shutil.rmtree(entry, ignore_errors=False, onerror=_ignore_missing)
            else:
                entry.unlink(missing_ok=True)
        fsync_dir(sdir)

    def needs_reclaim(self, sandbox_id: str) -> bool:
        sdir = self.sandbox_dir(sandbox_id)
        return any(p.name not in _KEEP_AFTER_RECLAIM for p in sdir.iterdir())

    def read_native(self, sandbox_id: str) -> NativeIdentity | None:
        """The supervisor's ``native.json``; None when missing or not a valid identity."""
        try:
            raw = _read_json(self.sandbox_dir(sandbox_id) / NATIVE_FILE, self.max_bytes)
            # written without fsync: after a host crash it may be torn; it then proves nothing
            return NativeIdentity.model_validate(raw) if isinstance(raw, dict) else None
        except (RegistryError, ValidationError):
            return None

    def read_exit(self, sandbox_id: str) -> ExitStatus | None:
        """The supervisor's ``exit.json``; None when missing or unreadable. An invalid one raises
        ``ValidationError`` (it is not taken as "no exit")."""
        try:
            raw = _read_json(self.sandbox_dir(sandbox_id) / EXIT_FILE, self.max_bytes)
        except RegistryError:
            return None
        return ExitStatus.model_validate(raw) if isinstance(raw, dict) else None
