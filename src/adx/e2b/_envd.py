"""The envd data plane, served on the API's own base URL for requests that carry ``E2b-Sandbox-Id``.

The E2B SDK sends every sandbox call to ``E2B_SANDBOX_URL`` with the headers ``E2b-Sandbox-Id``,
``E2b-Sandbox-Port`` (envd's 49983) and ``X-Access-Token``; no API key. So the access token is what names and
authenticates the tenant (:mod:`adx.e2b._tokens`); a wrong or missing token is refused before anything is
resolved or forwarded, and everything after goes through the Ingress as that tenant (SEC-2, SEC-4).
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import quote

from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from adx._wsproxy import deny
from adx.e2b import _signed as signed
from adx.e2b._connect import HTTP_STATUS, RpcError, error_response, rpc_error
from adx.e2b._files import HttpFailure, download, upload
from adx.e2b._filesystem import FilesystemService
from adx.e2b._hosts import SandboxHost, base_domain, parse_host
from adx.e2b._process import ProcessService
from adx.e2b._run_files import run_files_written
from adx.e2b._tokens import EnvdTokens
from adx.e2b._upstream import Execd
from adx.e2b._user import envd_user
from adx.errors import AdxError, ConflictError, InvalidInputError, NoCapacityError, NotFoundError
from adx.gateway import Plane, environment_id_or_404
from adx.ingress import serving_ingress
from adx.model import EnvironmentState

SANDBOX_HEADER = b"e2b-sandbox-id"
_ON_ITS_WAY = frozenset({EnvironmentState.PENDING, EnvironmentState.STARTING, EnvironmentState.RESUMING})
ENVD_PORT = "49983"


def tokens_for(app: Any) -> EnvdTokens:
    """The app's token minter/checker, made on first use from the API's configuration."""
    tokens = getattr(app.state, "e2b_tokens", None)
    if tokens is None:
        tokens = EnvdTokens.from_config(cast(Plane, app.state.plane).config)
        app.state.e2b_tokens = tokens
    return cast(EnvdTokens, tokens)


def _paused_answer(exc: AdxError, sandbox_id: str) -> JSONResponse | None:
    """E2B's proxy answer for traffic to a paused sandbox made with ``autoResume`` off: 409, the sandbox left
    paused (``Sandbox.connect`` resumes it). None: ``exc`` is another error."""
    if exc.details.get("wakeOnTraffic") is not False:
        return None
    return _http_error(
        409,
        f"The sandbox {sandbox_id} is paused and auto-resume is off (lifecycle auto_resume False): resume it with"
        " Sandbox.connect",
    )


def _unreachable(exc: AdxError, sandbox_id: str) -> RpcError:
    """How the E2B edge answers for a sandbox it cannot reach: 'not found' makes the SDK say it is not running."""
    if isinstance(exc, NotFoundError | ConflictError) and not isinstance(exc, NoCapacityError):
        state = exc.details.get("state")
        suffix = f" (it is {state})" if state else ""
        return RpcError("unavailable", f"The sandbox {sandbox_id} was not found{suffix}")
    return rpc_error(exc)


#: A refused request's unread body is read and dropped up to this size, so a client still sending it gets the
#: answer instead of a broken connection; beyond it the connection is closed.
DISCARD_BODY_BYTES = 64 << 20


async def _discard_unread_body(request: Request) -> None:
    seen = 0
    try:
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > DISCARD_BODY_BYTES:
                return
    except (RuntimeError, ClientDisconnect):
        return  # already consumed, or the client went away


class EnvdDataPlane:
    """ASGI middleware: requests with ``E2b-Sandbox-Id`` are envd calls; everything else passes through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and await self.websocket(WebSocket(scope, receive, send)):
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        response = await self.dispatch(request)
        if response is None:
            await self.app(scope, receive, send)
            return
        if response.status_code >= 400:
            await _discard_unread_body(request)
        await response(scope, receive, send)

    async def dispatch(self, request: Request) -> Response | None:
        """What a request is, by what it carries: the ``E2b-Sandbox-Id`` header (the SDK's calls at
        ``E2B_SANDBOX_URL``), a sandbox host name (``PORT-ID.DOMAIN``: envd on 49983, else the sandbox's port),
        or a signed ``/files`` URL at ``E2B_SANDBOX_URL``; None: not an E2B data-plane request."""
        if any(name == SANDBOX_HEADER for name, _ in request.scope["headers"]):
            sandbox_id = request.headers.get("e2b-sandbox-id", "")
            return await self.handle(request, sandbox_id, request.headers.get("e2b-sandbox-port", ENVD_PORT), None)
        app = request.scope["app"]
        tokens = tokens_for(app)
        config = cast(Plane, app.state.plane).config
        try:
            host = parse_host(tokens, request.headers.get("host", ""), base_domain(config.e2b_domain, None))
        except InvalidInputError as exc:
            return _http_error(404, f"no sandbox at this host name: {exc.message}")
        if host is not None:
            if str(host.port) != ENVD_PORT:
                return await self.port(request, host)
            return await self.handle(request, host.sandbox_id, ENVD_PORT, host.tenant)
        if signed.is_signed(request):
            try:
                tenant, sandbox_id = signed.find(tokens, request)
            except HttpFailure as exc:
                return exc.response()
            return await self.handle(request, sandbox_id, ENVD_PORT, tenant)
        return None

    async def port(self, request: Request, host: SandboxHost) -> Response:
        """``get_host(port)`` traffic: the sandbox's port through the Ingress and the Relay, as the tenant the
        host name proves (a paused sandbox is woken by it, as any data-plane request)."""
        ingress = serving_ingress(request.scope["app"])
        if ingress is None:
            return _http_error(501, "this server does not serve the data plane (ingress = false)")
        timeout = cast(Plane, request.scope["app"].state.plane).config.relay_timeout_seconds
        path = f"/port/{host.port}{_raw_path(request)}"
        try:
            return await ingress.forward(request, host.tenant, host.sandbox_id, path, read_timeout=timeout)
        except AdxError as exc:
            if (paused := _paused_answer(exc, host.sandbox_id)) is not None:
                return paused
            error = _unreachable(exc, host.sandbox_id)
            return _http_error(502 if error.code == "unavailable" else HTTP_STATUS[error.code], error.message)

    async def websocket(self, websocket: WebSocket) -> bool:
        """A WebSocket to ``get_host(port)``: the sandbox's port through the Ingress and the Relay, as the tenant
        the host name proves (as ``port``: a paused sandbox is woken by it). False: not a sandbox port's host
        name (the app answers it)."""
        app = websocket.scope["app"]
        config = cast(Plane, app.state.plane).config
        try:
            host = parse_host(tokens_for(app), websocket.headers.get("host", ""), base_domain(config.e2b_domain, None))
        except InvalidInputError as exc:
            await deny(websocket, _http_error(404, f"no sandbox at this host name: {exc.message}"))
            return True
        if host is None or str(host.port) == ENVD_PORT:
            return False
        ingress = serving_ingress(app)
        if ingress is None:
            await deny(websocket, _http_error(501, "this server does not serve the data plane (ingress = false)"))
            return True
        path = f"/port/{host.port}{_raw_path(websocket)}"
        try:
            await ingress.forward_websocket(websocket, host.tenant, host.sandbox_id, path)
        except AdxError as exc:
            if (paused := _paused_answer(exc, host.sandbox_id)) is not None:
                await deny(websocket, paused)
                return True
            error = _unreachable(exc, host.sandbox_id)
            status = 502 if error.code == "unavailable" else HTTP_STATUS[error.code]
            await deny(websocket, _http_error(status, error.message))
        return True

    async def handle(self, request: Request, sandbox_id: str, port: str, tenant: str | None) -> Response:
        """An envd call; ``tenant``: the one the URL names (host name or signature), still to be proven by the
        access token or the signature."""
        path = request.url.path
        rpc = path.count("/") == 2 and "." in path.split("/")[1]
        try:
            return await self._route(request, path, sandbox_id, port, tenant)
        except RpcError as exc:
            return error_response(request, exc) if rpc else _http_error(HTTP_STATUS[exc.code], exc.message)
        except HttpFailure as exc:
            return exc.response()
        except AdxError as exc:
            if (paused := _paused_answer(exc, sandbox_id)) is not None:
                return paused  # the proxy's answer, before envd: plain HTTP for RPCs too
            error = _unreachable(exc, sandbox_id)
            if rpc:
                return error_response(request, error)
            if isinstance(exc, InvalidInputError):
                return _http_error(400, exc.message)
            return _http_error(502 if error.code == "unavailable" else HTTP_STATUS[error.code], error.message)

    async def _route(self, request: Request, path: str, sandbox_id: str, port: str, named: str | None) -> Response:
        app = request.scope["app"]
        plane = cast(Plane, app.state.plane)
        tenant = _authenticate(tokens_for(app), request, sandbox_id, named)
        if port != ENVD_PORT:
            raise RpcError("unimplemented", f"port {port}: only envd's port {ENVD_PORT} is served")
        ingress = serving_ingress(app)
        if ingress is None:
            raise RpcError("unavailable", "this server does not serve the data plane (ingress = false)")
        execd = Execd(ingress, tenant, environment_id_or_404(sandbox_id))
        if path == "/health" and request.method == "GET":
            # A health check never wakes a paused sandbox. Anything not running answers what E2B's proxy does for
            # a sandbox that is gone: 502 "... was not found", the words the SDK reads as "not running" (its
            # probe after a broken stream raises SandboxNotRunningException on them, SandboxUnreachable else).
            record = await plane.coordinator.get_environment(tenant, environment_id_or_404(sandbox_id))
            if record.state in _ON_ITS_WAY:  # it will be back: "port is not open" (SandboxUnreachable), not gone
                return _http_error(502, f"sandbox {sandbox_id} is {record.state.value}: envd's port is not open yet")
            if record.state is not EnvironmentState.RUNNING:
                return _http_error(502, f"The sandbox {sandbox_id} was not found (it is {record.state.value})")
            status, body = await execd.call("GET", "/v1/health")
            if status != 200:
                return _http_error(502, f"envd of sandbox {sandbox_id} is not healthy: {body[:200]!r}")
            return Response(status_code=204)
        await run_files_written(tenant, execd.environment_id)  # as envd's own, there before its first answer
        # A signed URL is for its own path only: an upload's part names no other target.
        only = request.query_params.get("path") if signed.is_signed(request) else None
        user = envd_user(request)  # E2B's ``user`` unless the SDK names another account
        if path == "/files" and request.method == "GET":
            return await download(execd, request, user)
        if path == "/files" and request.method == "POST":
            return await upload(execd, request, user, only=only)
        service, _, method = path.lstrip("/").partition("/")
        if request.method == "POST" and service == "process.Process" and "/" not in method:

            async def template() -> str:
                route = ingress.cached_route(tenant, execd.environment_id, stale=True)  # an image never changes
                if route is None:  # resolved (and cached) now for the Start's forward: no extra Coordinator call
                    await ingress.relay_address(tenant, execd.environment_id)
                    route = ingress.cached_route(tenant, execd.environment_id, stale=True)
                record = (
                    route.record
                    if route is not None
                    else await plane.coordinator.get_environment(tenant, execd.environment_id)
                )
                return record.spec.image

            return await ProcessService(execd, user, template).dispatch(method, request)
        if request.method == "POST" and service == "filesystem.Filesystem" and "/" not in method:
            return await FilesystemService(execd, user).dispatch(method, request)
        if path.count("/") == 2 and "." in service:
            raise RpcError("unimplemented", f"{service}/{method} is not implemented")
        raise HttpFailure(404, f"no route {request.method} {path}")


def _authenticate(tokens: EnvdTokens, request: Request, sandbox_id: str, named: str | None) -> str:
    """The tenant of an envd call: the access token's, or, for a signed ``/files`` URL without one, the tenant
    the URL names once the signature proves it was made with that sandbox's token."""
    token = request.headers.get("x-access-token")
    if token or named is None or not signed.is_signed(request):
        tenant = tokens.tenant(token, sandbox_id)
        if named is not None and tenant != named:
            raise RpcError("unauthenticated", "invalid X-Access-Token")
        return tenant
    signed.check(tokens, named, sandbox_id, request)
    return named


def _raw_path(conn: HTTPConnection) -> str:
    """The path as the client sent it (still percent-encoded), so the sandbox's service sees exactly that."""
    raw = conn.scope.get("raw_path")
    return raw.decode("latin-1") if isinstance(raw, bytes) and raw else quote(conn.url.path)


def _http_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)
