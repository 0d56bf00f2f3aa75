"""The agent store's schema: numbered SQL migrations shipped in ``adx/agents/migrations``, applied each in one
transaction under an advisory lock, and the check that the real database holds exactly them."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources

from adx.agents._pg import Database
from adx.errors import UnavailableError

__all__ = ["Migration", "check_schema", "load_migrations", "migrate"]

log = logging.getLogger("adx.agents.store")

_LOCK_KEY = 0x4144585F41474E54  # "ADX_AGNT": the advisory lock serialising concurrent migrators
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_REQUIRED_TABLES = (
    "adx_agent_tenants",
    "adx_agent_runs",
    "adx_agent_checkpoints",
    "adx_agent_events",
    "adx_agent_waits",
    "adx_agent_attempts",
    "adx_agent_usage",
    "adx_agent_results",
    "adx_agent_workers",
    "adx_agent_early_resolutions",
    "adx_agent_run_actions",
    "adx_agent_environments",
)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    out = []
    for entry in resources.files("adx.agents").joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            out.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    out.sort(key=lambda m: m.version)
    if [m.version for m in out] != list(range(1, len(out) + 1)):
        raise RuntimeError("agent migrations must be numbered 0001.. without gaps")
    return out


async def migrate(db: Database) -> list[int]:
    """Apply missing migrations, each in one transaction, under an advisory lock. Returns applied versions."""
    applied: list[int] = []
    async with db.connection("migrate", writing=True) as conn:
        # Session-level lock: concurrent starters wait here, then see the versions the first one applied.
        await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS adx_agent_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cur = await conn.execute("SELECT version, checksum FROM adx_agent_migrations")
            done = {int(r["version"]): r["checksum"] for r in await cur.fetchall()}
            for migration in load_migrations():
                if migration.version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.sql.encode())
                    await conn.execute(
                        "INSERT INTO adx_agent_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                applied.append(migration.version)
                log.info("applied agent migration", extra={"version": migration.version, "migration": migration.name})
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied


async def check_schema(db: Database) -> None:
    """Verify the real database schema: every known migration applied unchanged, none unknown, tables present."""
    known = {m.version: m for m in load_migrations()}
    async with db.connection("check schema") as conn:
        cur = await conn.execute("SELECT to_regclass('adx_agent_migrations') IS NOT NULL AS present")
        row = await cur.fetchone()
        if not row or not row["present"]:
            raise UnavailableError("agent database schema is not installed (no adx_agent_migrations table)")
        cur = await conn.execute("SELECT version, checksum FROM adx_agent_migrations ORDER BY version")
        rows = await cur.fetchall()
        found = {int(r["version"]): r["checksum"] for r in rows}
        for version, checksum in found.items():
            if version not in known:
                raise UnavailableError(f"agent database schema has migration {version}, newer than this build")
            if known[version].checksum != checksum:
                raise UnavailableError(f"agent migration {version} was changed after it was applied")
        missing = sorted(set(known) - set(found))
        if missing:
            raise UnavailableError(f"agent database schema lacks migrations {missing}")
        for table in _REQUIRED_TABLES:
            cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL AS present", (table,))
            row = await cur.fetchone()
            if not row or not row["present"]:
                raise UnavailableError(f"agent database schema lacks table {table}")
