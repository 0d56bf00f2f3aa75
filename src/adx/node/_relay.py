"""The Relay: the node's data-plane proxy from Ingress to each sandbox's execd.

``/{environment_id}/{path}`` (any method) is forwarded to that Environment's execd at ``/{path}``, bodies
streamed both ways. The Relay counts open streams per Environment (the Relay side of idle detection,
IDLE-2) and holds the per-Environment admission gate that automatic pause closes (IDLE-6).

Served over HTTPS with mutual TLS: only holders of a cluster certificate can reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from adx._certs import CertPaths
from adx._fs import ShortUnixPath
from adx._proxy_answer import ProxiedAnswer, forwarded_headers, is_short
from adx._wsproxy import MAX_MESSAGE_BYTES, Refused, UpstreamError, WebSocketClient, bridge, deny, refusal_response
from adx.errors import (
    AdxError,
    ConflictError,
    EnvironmentPausedError,
    EnvironmentPausingError,
    NotFoundError,
    UnavailableError,
)
from adx.model import FORWARDED_HOST_HEADER
from adx.node._ports import NamespaceConnector, PortResponse, http_over_socket

log = logging.getLogger("adx.node.relay")

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy recomputes.
_DROP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
)
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@dataclass(frozen=True)
class RelayTarget:
    env_id: str
    execd_socket: Path
    # The execution's network namespace, for user ports (resolved lazily: most requests never need it).
    network_namespace: Callable[[], Awaitable[Path]] | None = None


@dataclass
class StreamCounts:
    """Open streams per Environment and a version bumped whenever a stream opens or closes."""

    open: dict[str, int] = field(default_factory=dict)
    version: dict[str, int] = field(default_factory=dict)
    closed_admission: set[str] = field(default_factory=set)
    #: Called with the Environment ID whenever its streams change (wakes its idle check, CTL-2).
    on_change: Callable[[str], None] | None = None

    def _bump(self, env_id: str) -> None:
        self.version[env_id] = self.version.get(env_id, 0) + 1
        if self.on_change is not None:
            self.on_change(env_id)

    def opened(self, env_id: str) -> None:
        self.open[env_id] = self.open.get(env_id, 0) + 1
        self._bump(env_id)

    def closed(self, env_id: str) -> None:
        self.open[env_id] = max(self.open.get(env_id, 0) - 1, 0)
        self._bump(env_id)

    def close_admission(self, env_id: str, expected_version: int) -> bool:
        """IDLE-6: close new-stream admission only if nothing changed since ``expected_version``."""
        if self.version.get(env_id, 0) != expected_version or self.open.get(env_id, 0):
            return False
        self.closed_admission.add(env_id)
        return True

    def open_admission(self, env_id: str) -> None:
        self.closed_admission.discard(env_id)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "details": {}}}, status_code=status)


@dataclass
class _Upstream:
    """How to reach one execd socket: a connectable path even when the real one exceeds sun_path."""

    socket: Path
    short_path: ShortUnixPath

    async def aclose(self) -> None:
        self.short_path.close()


async def _connect_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, path)
    except BaseException:
        sock.close()
        raise
    return sock


def _raw_target(conn: HTTPConnection, prefix: str) -> str:
    """The request target for the next hop: the path after ``prefix`` exactly as the client sent it (still
    percent-encoded: decoding it would change ``a%2Fb`` into ``a/b``, and ``%25`` into ``%``), and the query."""
    raw = conn.scope.get("raw_path")
    start = f"{prefix}/".encode()
    path = raw[len(start) - 1 :].decode("latin-1") if isinstance(raw, bytes) and raw.startswith(start) else None
    if path is None:
        path = "/" + quote(conn.path_params["path"])
    return path + (f"?{conn.url.query}" if conn.url.query else "")


class Relay:
    def __init__(
        self,
        resolve: Callable[[str], RelayTarget],
        *,
        upstream_timeout: float = 30.0,
        admission_wait: Callable[[str], Awaitable[bool]] | None = None,
        prepare: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """``resolve(env_id)`` returns the target or raises NotFoundError / ConflictError (not running).

        ``admission_wait(env_id)``: called for a request that meets closed admission (a pause in progress);
        True when the pause was cancelled and the request may go on (IDLE-6).

        ``prepare(env_id)``: awaited before resolving, e.g. to resume locally an Environment whose pause is not
        published yet (JRN-4: the Relay re-checks local bindings).
        """
        self.resolve = resolve
        self.prepare = prepare
        self.admission_wait = admission_wait
        self.upstream_timeout = upstream_timeout
        self.streams = StreamCounts()
        self._upstreams: dict[str, _Upstream] = {}
        self.ports = NamespaceConnector()
        self.app = Starlette(
            routes=[
                Route("/{env_id}/port/{port:int}/{path:path}", self.forward_port, methods=_METHODS),
                WebSocketRoute("/{env_id}/port/{port:int}/{path:path}", self.websocket_port),
                Route("/{env_id}/{path:path}", self.forward, methods=_METHODS),
            ]
        )

    async def _upstream(self, target: RelayTarget) -> _Upstream:
        current = self._upstreams.get(target.env_id)
        if current is not None and current.socket == target.execd_socket:
            return current
        if current is not None:  # a new execution: its execd listens elsewhere
            await current.aclose()
        upstream = _Upstream(target.execd_socket, ShortUnixPath(target.execd_socket))
        self._upstreams[target.env_id] = upstream
        return upstream

    async def forget(self, env_id: str) -> None:
        """Drop the pooled connections of an Environment that stopped running here."""
        upstream = self._upstreams.pop(env_id, None)
        if upstream is not None:
            await upstream.aclose()

    async def aclose(self) -> None:
        for env_id in list(self._upstreams):
            await self.forget(env_id)
        self.ports.close()

    async def _admitted_after_wait(self, env_id: str) -> bool:
        if self.admission_wait is None or not await self.admission_wait(env_id):
            return False
        return env_id not in self.streams.closed_admission

    async def _target(self, env_id: str) -> RelayTarget | JSONResponse:
        if self.prepare is not None:
            await self.prepare(env_id)
        return self._resolved(env_id)

    async def _stopped_meanwhile(self, env_id: str) -> JSONResponse | None:
        """After an upstream failure: the answer when the Environment stopped running here while the request was
        on its way (a delete or pause took its execd down), which is that answer and not a server error; None
        when it still runs (the failure is the upstream's)."""
        now = self._resolved(env_id)
        if not isinstance(now, JSONResponse):
            return None
        await self.forget(env_id)
        return now

    def _resolved(self, env_id: str) -> RelayTarget | JSONResponse:
        """The target, or the answer saying why there is none (gone, not running, unavailable)."""
        try:
            return self.resolve(env_id)
        except NotFoundError as exc:
            return _error(404, "not_found", exc.message)
        except ConflictError as exc:
            return _error(409, exc.code if isinstance(exc, EnvironmentPausedError) else "not_running", exc.message)
        except AdxError as exc:
            return _error(503, exc.code, exc.message)

    async def _port_target(self, env_id: str, port: int) -> RelayTarget | JSONResponse:
        """The target of a user port, or the answer refusing it (not running, no netns support, pausing)."""
        if not 1 <= port <= 65535:
            return _error(422, "invalid_input", "port must be 1-65535")
        target = await self._target(env_id)
        if isinstance(target, JSONResponse):
            return target
        if target.network_namespace is None:
            return _error(501, "not_supported", "this runtime cannot reach user ports")
        if env_id in self.streams.closed_admission and not await self._admitted_after_wait(env_id):
            return _error(503, EnvironmentPausingError.code, f"environment {env_id} is pausing; it resumes on demand")
        return target

    async def _connect_port(self, target: RelayTarget, port: int) -> socket.socket:
        assert target.network_namespace is not None  # _port_target checked it
        return await self.ports.connect(await target.network_namespace(), port)

    async def forward_port(self, request: Request) -> Response:
        """HTTP to a user's service listening on ``port`` inside the sandbox (its own network namespace)."""
        env_id, port = request.path_params["env_id"], int(request.path_params["port"])
        target = await self._port_target(env_id, port)
        if isinstance(target, JSONResponse):
            return target
        self.streams.opened(env_id)
        try:
            sock = await self._connect_port(target, port)
            headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_HEADERS]
            upstream = await http_over_socket(
                sock,
                request.method,
                _raw_target(request, f"/{env_id}/port/{port}"),
                headers,
                request.stream(),
                host=request.headers.get(FORWARDED_HOST_HEADER) or f"127.0.0.1:{port}",
            )
        except AdxError as exc:
            self.streams.closed(env_id)
            return _error(502, "port_unavailable", exc.message)
        except (OSError, h11.ProtocolError) as exc:
            self.streams.closed(env_id)
            return _error(502, "port_unavailable", f"port {port}: {exc}")
        return await self._stream_back(env_id, upstream, "port_unavailable")

    async def websocket_port(self, websocket: WebSocket) -> None:
        """A WebSocket to a user's service on ``port``: opened there with the client's path, query, headers and
        subprotocols, then relayed both ways (adx._wsproxy). An open WebSocket is an open stream (IDLE-2): the
        Environment is not paused for idleness under it."""
        env_id, port = websocket.path_params["env_id"], int(websocket.path_params["port"])
        target = await self._port_target(env_id, port)
        if isinstance(target, JSONResponse):
            await deny(websocket, target)
            return
        self.streams.opened(env_id)
        try:
            try:
                reader, writer = await asyncio.open_connection(sock=await self._connect_port(target, port))
                headers = [(k, v) for k, v in websocket.headers.items() if k.lower() not in _DROP_HEADERS]
                upstream = await WebSocketClient.open(
                    reader,
                    writer,
                    host=websocket.headers.get(FORWARDED_HOST_HEADER) or f"127.0.0.1:{port}",
                    target=_raw_target(websocket, f"/{env_id}/port/{port}"),
                    headers=headers,
                    subprotocols=list(websocket.scope.get("subprotocols") or []),
                    handshake_seconds=self.upstream_timeout,
                )
            except AdxError as exc:
                await deny(websocket, _error(502, "port_unavailable", exc.message))
                return
            except (OSError, UpstreamError) as exc:
                await deny(websocket, _error(502, "port_unavailable", f"port {port}: {exc}"))
                return
            if isinstance(upstream, Refused):
                await deny(websocket, refusal_response(upstream, _DROP_HEADERS))
                return
            await bridge(websocket, upstream, upstream.headers)
        finally:
            self.streams.closed(env_id)

    async def forward(self, request: Request) -> Response:
        env_id = request.path_params["env_id"]
        target = await self._target(env_id)
        if isinstance(target, JSONResponse):
            await self.forget(env_id)
            return target
        if env_id in self.streams.closed_admission and not await self._admitted_after_wait(env_id):
            return _error(503, EnvironmentPausingError.code, f"environment {env_id} is pausing; it resumes on demand")
        self.streams.opened(env_id)
        upstream_path = (await self._upstream(target)).short_path.path
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_HEADERS]
        # One h11 exchange on a fresh Unix-socket connection instead of a pooled httpx client: connecting to a
        # local socket costs tens of microseconds, httpx's pool and anyio layers cost ~1.5 ms of CPU a request
        # (bench/bench_hops.py, docs/performance.md). Closing the connection when the caller hangs up still
        # tells execd to stop a foreground command.
        try:
            sock = await asyncio.wait_for(_connect_unix(upstream_path), self.upstream_timeout)
            upstream = await http_over_socket(
                sock, request.method, _raw_target(request, f"/{env_id}"), headers, request.stream(), host="execd"
            )
        except (OSError, TimeoutError, h11.ProtocolError, AdxError) as exc:
            self.streams.closed(env_id)
            if (stopped := await self._stopped_meanwhile(env_id)) is not None:
                return stopped
            detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            return _error(502, "upstream_unavailable", f"execd of {env_id} did not answer: {detail}")
        return await self._stream_back(env_id, upstream, "upstream_unavailable")

    async def _stream_back(self, env_id: str, upstream: PortResponse, failure: str) -> Response:
        """``upstream``'s answer to the caller; the stream ``env_id`` holds open (IDLE-2) ends with its body.

        A short answer (a Content-Length up to SHORT_ANSWER_BYTES) is read here and sent whole, without the
        streaming machinery; a body that fails on the way is then answered as a failed connect is (``failure``)."""
        raw_headers = forwarded_headers(upstream.headers, _DROP_HEADERS)
        if is_short(upstream.headers):
            try:
                whole = b"".join([chunk async for chunk in upstream.body])
            except (OSError, h11.ProtocolError) as exc:
                if (stopped := await self._stopped_meanwhile(env_id)) is not None:
                    return stopped
                return _error(502, failure, f"the answer from {env_id} broke off: {str(exc) or type(exc).__name__}")
            finally:
                await _close_body(upstream)
                self.streams.closed(env_id)
            return ProxiedAnswer(upstream.status, raw_headers, whole=whole)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.body:
                    yield chunk
            finally:
                await _close_body(upstream)
                self.streams.closed(env_id)

        return ProxiedAnswer(upstream.status, raw_headers, chunks=body())


async def _close_body(upstream: PortResponse) -> None:
    if isinstance(upstream.body, AsyncGenerator):  # not run to its end: close its socket now
        await upstream.body.aclose()


class EmbeddedUvicorn(uvicorn.Server):
    """A uvicorn server inside a daemon that owns its signals: uvicorn must not replace our handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class RelayServer:
    server: uvicorn.Server
    task: asyncio.Task[None]

    @property
    def port(self) -> int:
        sockets = self.server.servers[0].sockets
        return int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, timeout=10)


#: Idle keep-alive of the Relay's server side; clients must expire theirs sooner (adx.ingress: 30 s).
RELAY_KEEP_ALIVE_SECONDS = 75


async def serve_relay(relay: Relay, listen: str, certs: CertPaths) -> RelayServer:
    return await serve_asgi(relay.app, listen, certs, "relay")


async def serve_asgi(app: Any, listen: str, certs: CertPaths | None, what: str) -> RelayServer:
    """Serve an ASGI app on ``host:port`` inside this event loop; mutual TLS when ``certs`` are given."""
    host, _, port = listen.rpartition(":")
    config = uvicorn.Config(
        app,
        host=host or "127.0.0.1",
        port=int(port),
        log_level="warning",
        lifespan="off",
        # Keep-alive connections (Ingress replicas, scrapers) must not hold a node's shutdown.
        timeout_graceful_shutdown=3,
        # Longer than any client keeps an idle connection (the Ingress: 30 s): a server that closes first races
        # the client's next request on it ("Server disconnected without sending a response", seen in CI after
        # a pause and resume left the API's connection idle past uvicorn's default 5 s).
        timeout_keep_alive=RELAY_KEEP_ALIVE_SECONDS,
        # WebSocket through port routing (adx._wsproxy): wsproto, with the proxy's own message limit.
        ws="wsproto",
        ws_max_size=MAX_MESSAGE_BYTES,
        # No certificates: plain TCP (uvicorn's defaults: no certificate, CERT_NONE).
        ssl_certfile=None if certs is None else str(certs.cert),
        ssl_keyfile=None if certs is None else str(certs.key),
        ssl_ca_certs=None if certs is None else str(certs.ca),
        ssl_cert_reqs=ssl.CERT_NONE if certs is None else ssl.CERT_REQUIRED,
    )
    server = EmbeddedUvicorn(config)
    task = asyncio.create_task(server.serve(), name=what)
    for _ in range(500):
        if server.started:
            return RelayServer(server, task)
        if task.done():
            break
        await asyncio.sleep(0.01)
    server.should_exit = True
    raise UnavailableError(f"{what} could not listen on {listen}")
