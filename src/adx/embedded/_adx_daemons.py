"""ADX's own daemons run as managed processes (``adx up``): sandboxd, the Coordinator, a node.

Each is a real ``adx <component> --config FILE`` subprocess with its configuration written into its state
directory, reused when alive and healthy, restarted on its state when crashed - like the embedded servers.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx

from adx._fs import atomic_write_bytes
from adx.embedded._process import ManagedServer
from adx.proto import health_pb2, health_pb2_grpc


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + " }"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_toml(values: dict[str, object]) -> str:
    """Flat keys and inline tables only: enough for the generated daemon configurations."""
    return "".join(f"{key} = {_toml_value(value)}\n" for key, value in values.items())


class AdxDaemon(ManagedServer):
    """``adx <command> --config <dir>/<kind>.toml`` as a managed process."""

    command: str = ""

    def __init__(
        self,
        state_dir: Path,
        *,
        config: Callable[[int], dict[str, object]],
        host: str = "127.0.0.1",
        port: int = 0,
        start_timeout: float = 60.0,
        stop_timeout: float = 15.0,
    ) -> None:
        super().__init__(state_dir, host, port, start_timeout, stop_timeout)
        self._config = config
        self.config_path = self.dir / f"{self.kind}.toml"

    def _command(self, port: int, unix_socket: str | None) -> list[str]:
        atomic_write_bytes(self.config_path, render_toml(self._config(port)).encode())
        return [sys.executable, "-m", "adx", self.command, "--config", str(self.config_path)]


class SandboxdDaemon(AdxDaemon):
    kind = "sandboxd"
    command = "sandboxd"
    log_name = "sandboxd.log"
    listens_on_tcp = False

    def __init__(self, state_dir: Path, *, socket_path: Path, config: Callable[[int], dict[str, object]]) -> None:
        super().__init__(state_dir, config=config)
        self.socket_path = socket_path

    def _url(self, port: int) -> str:
        return f"unix://{self.socket_path}"

    def _probe(self, url: str, unix_socket: str | None, timeout: float) -> str | None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(str(self.socket_path))
            except OSError as exc:
                return f"socket not accepting: {exc.strerror or exc}"
        return None


class GrpcDaemon(AdxDaemon):
    """A daemon serving gRPC with mutual TLS; healthy when its Health service says SERVING."""

    def __init__(self, state_dir: Path, *, credentials: grpc.ChannelCredentials, **kwargs: object) -> None:
        super().__init__(state_dir, **kwargs)  # type: ignore[arg-type]
        self.credentials = credentials

    def _url(self, port: int) -> str:
        return f"{self.host}:{port}"

    def _probe(self, url: str, unix_socket: str | None, timeout: float) -> str | None:
        target = url.replace("127.0.0.1", "localhost")
        try:
            with grpc.secure_channel(target, self.credentials) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            return f"health: {exc.code().name}"
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            return f"not serving: {reply.detail}"
        return None


class CoordinatorDaemon(GrpcDaemon):
    kind = "coordinator"
    command = "coordinator"
    log_name = "coordinator.log"


class NodeDaemon(GrpcDaemon):
    kind = "node"
    command = "node"
    log_name = "node.log"


class ApiDaemon(AdxDaemon):
    """``adx api`` (API server + Ingress on one HTTP port); healthy when ``/healthz`` answers 200."""

    kind = "api"
    command = "api"
    log_name = "api.log"

    def _url(self, port: int) -> str:
        return f"http://{self.host}:{port}"

    def _probe(self, url: str, unix_socket: str | None, timeout: float) -> str | None:
        try:
            response = httpx.get(f"{url}/healthz", timeout=timeout)
        except httpx.HTTPError as exc:
            return f"healthz: {exc or type(exc).__name__}"
        return None if response.status_code == 200 else f"healthz answered {response.status_code}"
