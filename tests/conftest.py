"""Session fixtures: private, real Redis and PostgreSQL server processes (from adx.embedded).

- ``redis_server`` / ``postgres_server``: one instance each for the whole session (do not kill these).
- ``redis_factory`` / ``postgres_factory``: per-test instances a test may SIGKILL and restart.
- ``postgres_dsn``: a fresh, empty database on the session server for one test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from adx.config import PostgresServerConfig, RedisServerConfig
from adx.embedded import EmbeddedPostgres, EmbeddedRedis, ServerInfo


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("session-redis"))
    info = server.start()
    yield info
    server.stop()


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    server = EmbeddedPostgres(tmp_path_factory.mktemp("session-pg"))
    info = server.start()
    yield info
    server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: ServerInfo) -> Iterator[str]:
    """A new empty database on the session PostgreSQL server, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = postgres_server.url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield postgres_server.url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedRedis]]:
    """Start private Redis servers for one test; each may be SIGKILLed and ``start()``ed again."""
    made: list[EmbeddedRedis] = []

    def make(name: str = "redis", **config: object) -> EmbeddedRedis:
        server = EmbeddedRedis(tmp_path / name, RedisServerConfig.model_validate(config))
        server.start()
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def postgres_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedPostgres]]:
    """Start private PostgreSQL servers for one test; each may be SIGKILLed and ``start()``ed again."""
    made: list[EmbeddedPostgres] = []

    def make(name: str = "pg", **config: object) -> EmbeddedPostgres:
        server = EmbeddedPostgres(tmp_path / name, PostgresServerConfig.model_validate(config))
        server.start()
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()
