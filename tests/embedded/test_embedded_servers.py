"""The embedded servers are real processes with real persistence, and fail clearly."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import redis

from adx.config import PostgresServerConfig, RedisServerConfig
from adx.embedded import EmbeddedPostgres, EmbeddedRedis, ServerState
from adx.embedded._binaries import redis_server_binary
from adx.errors import UnavailableError


def test_sigkill_redis_gives_connection_error_and_aof_keys_survive_restart(
    redis_factory: Callable[..., EmbeddedRedis],
) -> None:
    server = redis_factory()
    info = server.read_info()
    assert info is not None
    client = redis.Redis.from_url(info.url, socket_timeout=2)
    for i in range(100):
        client.set(f"k{i}", f"v{i}")
    client.incrby("counter", 41)
    client.incr("counter")

    server.send_signal(signal.SIGKILL)
    server.wait_exited()
    assert server.status().state is ServerState.CRASHED
    with pytest.raises(redis.ConnectionError):
        client.ping()

    restarted = server.start()
    assert restarted.pid != info.pid
    assert restarted.port == info.port  # a crash restart keeps the address clients hold
    client = redis.Redis.from_url(restarted.url, socket_timeout=2)
    assert client.get("counter") == b"42"
    assert [client.get(f"k{i}") for i in range(100)] == [f"v{i}".encode() for i in range(100)]


def test_redis_config_uses_aof_with_configured_fsync(redis_factory: Callable[..., EmbeddedRedis]) -> None:
    always = redis_factory("always")
    everysec = redis_factory("everysec", appendfsync="everysec")
    for server, expected in ((always, "always"), (everysec, "everysec")):
        info = server.read_info()
        assert info is not None
        client = redis.Redis.from_url(info.url)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": expected}


def test_second_start_on_same_state_dir_reuses_running_server(tmp_path: Path) -> None:
    first = EmbeddedRedis(tmp_path)
    info = first.start()
    try:
        second = EmbeddedRedis(tmp_path)
        again = second.start()
        assert second.reused
        assert again == info
        assert second.status().state is ServerState.RUNNING
    finally:
        first.stop()
    assert first.status().state is ServerState.STOPPED


def test_sigkill_postgres_then_restart_keeps_committed_rows(
    postgres_factory: Callable[..., EmbeddedPostgres],
) -> None:
    server = postgres_factory()
    info = server.read_info()
    assert info is not None
    with psycopg.connect(info.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
    server.send_signal(signal.SIGKILL)
    server.wait_exited()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(info.url, connect_timeout=2)
    assert server.status().state is ServerState.CRASHED

    restarted = server.start()
    with psycopg.connect(restarted.url) as conn:
        row = conn.execute("SELECT count(*), sum(x) FROM t").fetchone()
    assert row == (1000, 500500)


def test_port_clash_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(UnavailableError, match=rf"port {port} on 127.0.0.1 is already in use"):
            EmbeddedRedis(tmp_path, RedisServerConfig(port=port)).start()
        with pytest.raises(UnavailableError, match=rf"port {port} on 127.0.0.1 is already in use"):
            EmbeddedPostgres(tmp_path, PostgresServerConfig(port=port)).start()
    assert not (tmp_path / "redis" / "server.json").exists()


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError, match="missing or not executable"):
        redis_server_binary(tmp_path / "no-such-redis-server")
    with pytest.raises(UnavailableError, match=r"PostgreSQL binaries \(postgres, initdb\) not found"):
        EmbeddedPostgres(tmp_path, bin_dir=tmp_path)


def test_session_servers_answer(redis_server, postgres_server) -> None:
    assert redis.Redis.from_url(redis_server.url).ping()
    with psycopg.connect(postgres_server.url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("adx",)
