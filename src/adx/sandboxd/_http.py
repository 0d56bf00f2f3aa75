"""sandboxd's API server: JSON over HTTP/1.1 on a private Unix socket, with peer-credential checks.

Why HTTP and not gRPC here: grpcio for Python exposes no peer credentials on Unix sockets (``peer()`` is
just ``unix:``), and SBX-4/SEC-5 require checking the connecting process's UID. An asyncio stream server
hands us the connected socket, so every connection's ``SO_PEERCRED`` is read before any byte of a request
is parsed. The protocol is deliberately tiny — ``POST /v1/<Call>``, ``Content-Length`` bodies, keep-alive —
and the typed models in ``_models`` are the contract; ``_client`` speaks it on asyncio streams. HTTP itself
(parsing, and the caps on request line, headers, body and time) is ``adx._httpserver``, shared with the agent
worker's health endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from adx._httpserver import HttpLimits, HttpRequest, HttpResponse, refuse_connection, serve_http
from adx.errors import (
    AdxError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.sandboxd._errors import PermissionDeniedError
from adx.sandboxd._unix_sockets import peer_credentials

__all__ = ["ApiServer", "Route"]

log = logging.getLogger("adx.sandboxd.api")

#: Create requests carry whole specs (env, argv, metadata): 16 MiB is far above any real one.
LIMITS = HttpLimits(body_bytes=16 << 20, head_seconds=30.0, body_seconds=30.0, idle_seconds=300.0)

Handler = Callable[[Any], Awaitable[BaseModel]]


class Route:
    def __init__(self, model: type[BaseModel] | None, handler: Handler, timeout: float | None, shield: bool) -> None:
        self.model = model
        self.handler = handler
        self.timeout = timeout  # None: the handler bounds itself (Wait)
        self.shield = shield  # mutating calls finish even when the caller's deadline passes


def _error_body(exc: AdxError) -> tuple[int, str, bytes]:
    """The status its class declares (``adx.errors``' table), and the error as every ADX HTTP body carries it."""
    status = exc.http_status
    reason = HTTPStatus(status).phrase
    body = json.dumps({"error": {"code": exc.code, "message": exc.message, "details": exc.details}}, default=str)
    return status, reason, body.encode()


def _refusal(status: int, message: str) -> bytes:
    """A request refused by the HTTP limits (``LIMITS``): its status, the body every sandboxd error has."""
    return _error_body(InvalidInputError("request", message))[2]


class ApiServer:
    def __init__(self, socket_path: Path, routes: dict[str, Route], allowed_uid: int) -> None:
        self.socket_path = socket_path
        self.routes = routes
        self.allowed_uid = allowed_uid
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        parent = self.socket_path.parent
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(parent, 0o700)  # the directory is the first gate; the socket mode the second
        # We hold daemon.lock, so a socket file left here belongs to a dead predecessor.
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        old = os.umask(0o177)  # no window in which the socket exists with a wider mode
        try:
            self._server = await asyncio.start_unix_server(self._handle, path=str(self.socket_path), limit=1 << 16)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        # Python 3.11's server leaves the socket file; a stale file would look like a live daemon.
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            pid, uid, _gid = peer_credentials(writer.get_extra_info("socket"))
        except OSError:
            writer.close()
            return
        if uid == self.allowed_uid:
            await serve_http(reader, writer, self._serve, _refusal, LIMITS)
            return
        log.warning("refused peer", extra={"peer_pid": pid, "peer_uid": uid})
        exc = PermissionDeniedError(f"peer uid {uid} is not allowed (sandboxd runs as uid {self.allowed_uid})")
        status, _reason, body = _error_body(exc)
        try:
            await refuse_connection(reader, writer, HttpResponse(status, body), LIMITS)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, request: HttpRequest) -> HttpResponse:
        status, _reason, payload = await self._dispatch(request.method, request.target, request.body)
        return HttpResponse(status, payload)

    async def _dispatch(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        route = self.routes.get(path.removeprefix("/v1/")) if path.startswith("/v1/") else None
        if route is None or method != "POST":
            return _error_body(NotFoundError(f"no such call: {method} {path}"))
        try:
            arg: Any = None
            if route.model is not None:
                try:
                    arg = route.model.model_validate_json(body or b"{}")
                except ValidationError as exc:
                    err = exc.errors()[0]
                    field = ".".join(str(p) for p in err["loc"])
                    raise InvalidInputError(field, err["msg"]) from None
            coro = route.handler(arg)
            if route.timeout is None:
                result = await coro
            elif route.shield:
                task = asyncio.ensure_future(coro)
                try:
                    result = await asyncio.wait_for(asyncio.shield(task), route.timeout)
                except TimeoutError:
                    raise UncertainOutcomeError(
                        f"{path} did not finish within {route.timeout}s; it continues in sandboxd — query its state"
                    ) from None
            else:
                result = await asyncio.wait_for(coro, route.timeout)
            return 200, "OK", result.model_dump_json().encode()
        except AdxError as exc:
            return _error_body(exc)
        except TimeoutError:
            return _error_body(UnavailableError(f"{path} timed out"))
        except Exception as exc:
            log.exception("unexpected error in %s", path)
            return _error_body(AdxError(f"internal error: {type(exc).__name__}: {exc}"))
