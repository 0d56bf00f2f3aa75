"""The degradation journal (JRN-1..8): results the node finished while the Coordinator could not store them.

A SQLite database (WAL, ``synchronous=FULL``) at the configured ``degradation_journal`` path. It exists only
while something is pending: it is created (schema first, at a temporary name, then renamed into place) by the
first append, and removed when the last entry has been replayed (JRN-1). It holds ordered, de-duplicated
pending results, never a catalog (JRN-3): each row is one compare-and-set commit the Controller would have
made, with the revision it expected and the revision it produced, so a pause followed by a resume replays as
two commits in order.

A file that cannot be read as a journal of this schema stops the adxlet at start, naming the file: it is
never read as empty (JRN-7). A failed write raises ``UnavailableError`` and the caller never reports the
result as journaled (JRN-2).

SQLite calls block, so every call runs in a worker thread, one at a time (appends and removals keep their
order).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from adx._fs import atomic_write_bytes, fsync_dir
from adx.errors import InvalidInputError, UnavailableError
from adx.model import EnvironmentSpec, EnvironmentState

log = logging.getLogger("adx.node.journal")
T = TypeVar("T")

#: PRAGMA user_version of the schema below; any other value is not a journal this code can read.
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE pending_results (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    env_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    base_revision INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    base_state TEXT NOT NULL,
    base_execution_id TEXT,
    state TEXT NOT NULL,
    execution_id TEXT,
    changes TEXT NOT NULL,
    release_reservation INTEGER NOT NULL,
    spec_digest TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    UNIQUE (env_id, generation, revision)
);
"""
_COLUMNS = (
    "seq",
    "env_id",
    "generation",
    "base_revision",
    "revision",
    "base_state",
    "base_execution_id",
    "state",
    "execution_id",
    "changes",
    "release_reservation",
    "spec_digest",
    "recorded_at",
)


def spec_digest(spec: EnvironmentSpec) -> str:
    """What "the same request spec" means on replay (JRN-6): a digest of the spec's canonical wire form,
    without its mutable fields (NOD-10: a network policy changed meanwhile is an update, not a conflict)."""
    fixed = {k: v for k, v in spec.to_wire().items() if k != "network"}
    wire = json.dumps(fixed, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(wire.encode()).hexdigest()


@dataclass(frozen=True)
class NewResult:
    """One commit a Controller hands to :meth:`DegradationJournal.append`: ``changes`` (wire names) applied on
    ``base_revision`` of ownership ``generation`` produce ``revision``."""

    env_id: str
    generation: int
    base_revision: int
    base_state: EnvironmentState
    base_execution_id: str | None
    state: EnvironmentState
    execution_id: str | None
    changes: dict[str, object]
    release_reservation: bool
    spec_digest: str

    @property
    def revision(self) -> int:
        return self.base_revision + 1


@dataclass(frozen=True)
class PendingResult(NewResult):
    """A result as the journal holds it until the Coordinator has stored it: with its place in the journal's
    order (``seq``) and when it was recorded."""

    seq: int
    recorded_at: float


class JournalCorruptError(InvalidInputError):
    """The journal file exists but is not a readable journal: the adxlet refuses to start (JRN-7)."""

    code = "journal_corrupt"


class DegradationJournal:
    """The SQLite journal at ``path`` (``None``: not configured, every call is a no-op or refused)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        #: JRN-8: set at start when the journal was deleted behind the node's back while it held results.
        self.lost = False
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._serial = asyncio.Lock()

    @property
    def configured(self) -> bool:
        return self.path is not None

    @property
    def exists(self) -> bool:
        return self.path is not None and self.path.exists()

    # -- start ---------------------------------------------------------------------------------------
    def open_existing(self) -> list[PendingResult]:
        """At start (NOD-17): validate and load a journal left by an earlier process, if any.

        Raises JournalCorruptError naming the file when it is not a readable journal."""
        if self.path is None:
            return []
        self._remove_stale_creations()
        marker = self._marker()
        if not self.path.exists():
            if marker.exists():
                # The marker outlives the database only when someone else removed it while it held results.
                self.lost = True
                marker.unlink()
                fsync_dir(marker.parent)
            return []
        db: sqlite3.Connection | None = None
        try:
            db = self._connect(self.path, create=False)
            (check,) = db.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version != SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"schema version {version}, expected {SCHEMA_VERSION}")
            columns = tuple(row[1] for row in db.execute("PRAGMA table_info(pending_results)"))
            if columns != _COLUMNS:
                raise sqlite3.DatabaseError(f"table pending_results has columns {columns}")
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM pending_results ORDER BY seq").fetchall()
            entries = [_entry(row) for row in rows]
        except (sqlite3.Error, ValueError, KeyError) as exc:
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.close()
            raise JournalCorruptError(
                "degradation_journal",
                f"{self.path} is not a readable degradation journal ({exc}); it is never read as empty: "
                "repair it or move it aside (its un-replayed results are then lost, JRN-8)",
                details={"path": str(self.path)},
            ) from None
        self._db = db
        if not entries:
            self._drop_file()
        return entries

    # -- async API (each call in a worker thread, one at a time) ----------------------------------------
    async def _run(self, call: Callable[[], T]) -> T:
        async with self._serial:
            return await asyncio.to_thread(self._locked, call)

    def _locked(self, call: Callable[[], T]) -> T:
        with self._lock:
            return call()

    async def append(self, result: NewResult) -> PendingResult:
        """Store one pending result durably (one SQLite transaction, fsynced) and return it; a result already
        stored (same Environment, generation and revision) is returned as it is (de-duplicated).

        Raises UnavailableError when it could not be stored: the caller never reports Journaled (JRN-2)."""
        if self.path is None:
            raise UnavailableError("no degradation_journal is configured")
        return await self._run(lambda: self._append(result))

    async def pending(self, env_id: str | None = None) -> list[PendingResult]:
        return await self._run(lambda: self._pending(env_id))

    async def remove(self, seqs: list[int]) -> int:
        """Forget replayed (or dropped) entries; returns how many remain. The file goes with the last one."""
        return await self._run(lambda: self._remove(seqs))

    async def count(self) -> int:
        return len(await self.pending())

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- sync core (called with the lock held) ------------------------------------------------------------
    def _connect(self, path: Path, *, create: bool) -> sqlite3.Connection:
        uri = f"file:{path}?mode={'rwc' if create else 'rw'}"
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=5.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def _ensure_db(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        assert self.path is not None
        if not self.path.exists():
            self._create()
        self._db = self._connect(self.path, create=False)
        return self._db

    def _create(self) -> None:
        """Schema at a temporary name, fsynced, renamed into place: the real path never holds a half-made
        database (so a file there that is not a journal is corruption, never "not created yet")."""
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_bytes(self._marker(), b"the degradation journal holds unpublished results\n")
        tmp = self.path.with_name(f".{self.path.name}.creating.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        db = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=DELETE")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN")
            db.execute(_SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        finally:
            db.close()
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        log.warning("degradation journal created: results are pending publication", extra={"path": str(self.path)})

    def _marker(self) -> Path:
        """A file that exists exactly while the journal holds results (made before the database, removed after
        it): a marker without a database means the journal was deleted with results in it (JRN-8)."""
        assert self.path is not None
        return self.path.with_name(f"{self.path.name}.pending")

    def _remove_stale_creations(self) -> None:
        assert self.path is not None
        if not self.path.parent.exists():
            return
        for stale in self.path.parent.glob(f".{self.path.name}.creating.*"):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()

    def _append(self, result: NewResult) -> PendingResult:
        try:
            db = self._ensure_db()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(
                    "INSERT INTO pending_results (env_id, generation, base_revision, revision, base_state,"
                    " base_execution_id, state, execution_id, changes, release_reservation, spec_digest, recorded_at)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
                    " ON CONFLICT (env_id, generation, revision) DO NOTHING",
                    (
                        result.env_id,
                        result.generation,
                        result.base_revision,
                        result.revision,
                        result.base_state.value,
                        result.base_execution_id,
                        result.state.value,
                        result.execution_id,
                        json.dumps(result.changes, sort_keys=True),
                        int(result.release_reservation),
                        result.spec_digest,
                        time.time(),
                    ),
                )
                row = db.execute(
                    f"SELECT {', '.join(_COLUMNS)} FROM pending_results"
                    " WHERE env_id = ? AND generation = ? AND revision = ?",
                    (result.env_id, result.generation, result.revision),
                ).fetchone()
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
        except (sqlite3.Error, OSError) as exc:
            self._forget_connection()
            raise UnavailableError(f"degradation journal {self.path}: write failed: {exc}") from None
        return _entry(row)

    def _pending(self, env_id: str | None) -> list[PendingResult]:
        if self._db is None and not self.exists:
            return []
        db = self._ensure_db()
        query = f"SELECT {', '.join(_COLUMNS)} FROM pending_results"
        if env_id is None:
            rows = db.execute(query + " ORDER BY seq").fetchall()
        else:
            rows = db.execute(query + " WHERE env_id = ? ORDER BY seq", (env_id,)).fetchall()
        return [_entry(row) for row in rows]

    def _remove(self, seqs: list[int]) -> int:
        if self._db is None and not self.exists:
            return 0
        db = self._ensure_db()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("DELETE FROM pending_results WHERE seq = ?", [(seq,) for seq in seqs])
            (left,) = db.execute("SELECT count(*) FROM pending_results").fetchone()
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            self._forget_connection()
            raise UnavailableError(f"degradation journal {self.path}: {exc}") from None
        if left == 0:
            self._drop_file()
        return int(left)

    def _drop_file(self) -> None:
        """Nothing is pending: checkpoint, close and remove the database (JRN-1: no file while nothing is
        pending). A crash in between leaves either an empty journal or none, both meaning nothing pending."""
        assert self.path is not None
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()
            self._db = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                self.path.with_name(self.path.name + suffix).unlink()
        with contextlib.suppress(OSError):
            fsync_dir(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            self._marker().unlink()
        with contextlib.suppress(OSError):
            fsync_dir(self.path.parent)
        log.info("degradation journal empty: file removed", extra={"path": str(self.path)})

    def _forget_connection(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None


def _entry(row: tuple[Any, ...]) -> PendingResult:
    changes = json.loads(row[9])
    if not isinstance(changes, dict):
        raise ValueError(f"entry {row[0]}: changes is not an object")
    if int(row[4]) != int(row[3]) + 1:
        # The revision column is stored for the UNIQUE key; a commit always produces its base revision + 1.
        raise ValueError(f"entry {row[0]}: revision {row[4]} does not follow base revision {row[3]}")
    return PendingResult(
        seq=int(row[0]),
        env_id=str(row[1]),
        generation=int(row[2]),
        base_revision=int(row[3]),
        base_state=EnvironmentState(row[5]),
        base_execution_id=row[6],
        state=EnvironmentState(row[7]),
        execution_id=row[8],
        changes=changes,
        release_reservation=bool(row[10]),
        spec_digest=str(row[11]),
        recorded_at=float(row[12]),
    )
