"""The embedded Redis server: a real redis-server with AOF persistence."""

from __future__ import annotations

from pathlib import Path

import redis

from adx.config import RedisServerConfig
from adx.embedded._binaries import redis_server_binary
from adx.embedded._process import MAX_UNIX_SOCKET_PATH, ManagedServer, listen_and_timeouts


class EmbeddedRedis(ManagedServer):
    """A redis-server process whose data lives in ``<state_dir>/redis``.

    Persistence is AOF only (``appendonly yes``), with ``appendfsync`` from the configuration: ``always``
    (the default) makes every acknowledged write survive a SIGKILL of the server or a machine crash.
    """

    kind = "redis"
    log_name = "redis.log"

    def __init__(self, state_dir: Path, config: RedisServerConfig | None = None, binary: Path | None = None) -> None:
        self.config = config or RedisServerConfig()
        super().__init__(state_dir, *listen_and_timeouts(self.config))
        self.binary = redis_server_binary(binary)
        self.data_dir = self.dir / "data"

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _unix_socket_path(self, port: int) -> str | None:
        path = str(self.dir / "redis.sock")
        return path if len(path) <= MAX_UNIX_SOCKET_PATH else None

    def _config_text(self, port: int, unix_socket: str | None) -> str:
        lines = [
            f"bind {self.host}",
            f"port {port}",
            "protected-mode yes",
            "daemonize no",
            f'dir "{self.data_dir}"',
            "appendonly yes",
            'appendfilename "appendonly.aof"',
            f"appendfsync {self.config.appendfsync}",
            # AOF is the only persistence: RDB snapshots would fork the server for nothing.
            'save ""',
            "loglevel notice",
            'logfile ""',
        ]
        if unix_socket:
            lines += [f'unixsocket "{unix_socket}"', "unixsocketperm 700"]
        return "\n".join(lines) + "\n"

    def _command(self, port: int, unix_socket: str | None) -> list[str]:
        conf = self.dir / "redis.conf"
        conf.write_text(self._config_text(port, unix_socket))
        conf.chmod(0o600)
        return [str(self.binary), str(conf)]

    def _url(self, port: int) -> str:
        return f"redis://{self.host}:{port}/0"

    def _probe(self, url: str, unix_socket: str | None, timeout: float) -> str | None:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            client.ping()
        except redis.RedisError as exc:
            return f"PING failed: {exc}"
        finally:
            client.close()
        return None
