"""Data-plane routes: ``/v1/environments/{id}/commands``, ``/files``, ``/ports`` (mapped to execd's routes).

Each takes the tenant's API key or an endpoint token of that Environment (SEC-4, ``_tokens``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, cast
from urllib.parse import quote

from fastapi import APIRouter, Path, Query, Request, WebSocket
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaValue
from starlette.requests import HTTPConnection
from starlette.responses import Response, StreamingResponse

from adx._wsproxy import deny
from adx.errors import AdxError, InvalidInputError
from adx.gateway import (
    ERRORS,
    Credentials,
    OpenApiResponses,
    Plane,
    environment_id_or_404,
    error_answer,
    error_response,
    json_body,
    plane,
    raw_body,
    read_body,
)
from adx.ingress._ingress import Ingress, serving_ingress
from adx.ingress._tokens import PresentedToken, check_scope, presented_token, set_token_cookie
from adx.model import (
    ACCOUNT,
    COMMAND_ID,
    NO_NUL,
    CommandList,
    CommandOutput,
    CommandStarted,
    CommandStatus,
    Encoding,
    ExitFrame,
    FileList,
    FileStat,
    FileWritten,
    KillCommand,
    Killed,
    OutputFrame,
    PathAnswer,
    Resized,
    RunCommand,
    StdinWritten,
    TokenGrant,
    WindowSize,
)


def route(path: str, methods: list[str], **options: Any) -> Callable[[F], F]:
    """One route per method, so every operation gets its own OpenAPI operation ID."""

    def register(fn: F) -> F:
        for method in methods:
            router.add_api_route(path, fn, methods=[method], name=f"{fn.__name__}_{method.lower()}", **options)
        return fn

    return register


F = TypeVar("F", bound=Callable[..., Any])
EnvId = Annotated[str, Path(description="the Environment's ID")]
#: What every data-plane route may answer besides its success: the API's own answers and execd's (which the
#: Ingress relays as they are: execd says 400 where the API says 422 for invalid input).
DATA_ERRORS: OpenApiResponses = {
    **ERRORS,
    400: error_answer("execd refused the request (code invalid_input, details.field)"),
    403: error_answer(
        "an endpoint token of another Environment or port (code forbidden), or the sandbox refused "
        "access to a file (code permission_denied)"
    ),
    404: error_answer("no such Environment for this tenant, command or file"),
    408: error_answer("the request body stalled (code request_timeout)"),
    409: error_answer(
        "the Environment is not running (code not_running), or the command or file is not in a "
        "state for this (code conflict, stdin_blocked)"
    ),
    413: error_answer("execd: a JSON body over its 1 MiB limit (code payload_too_large)"),
    502: error_answer("the node's Relay failed"),
}

router = APIRouter(tags=["data plane"], responses=DATA_ERRORS)


@dataclass(frozen=True)
class Access:
    """Who a data-plane request acts for, and the endpoint token it came with (if any)."""

    ingress: Ingress
    tenant: str
    env_id: str
    token: tuple[PresentedToken, TokenGrant] | None = None

    async def forward(
        self, request: Request, execd_path: str, *, body: bytes | None = None, read_timeout: float | None
    ) -> StreamingResponse:
        response = await self.ingress.forward(
            request, self.tenant, self.env_id, execd_path, body=body, read_timeout=read_timeout
        )
        if self.token is not None:
            set_token_cookie(response, request, *self.token)
        return response


async def _setup(request: HTTPConnection, credentials: object, environment_id: str, port: int | None = None) -> Access:
    """SEC-4: the tenant key, or the endpoint token and its scope (this Environment; this port when it is
    port-scoped), is checked before any route lookup, wake-up or forwarding."""
    ingress = serving_ingress(request.app)
    if ingress is None:  # the routes are mounted only with an Ingress (create_app)
        raise RuntimeError("the data-plane routes are served without an Ingress")
    bearer = cast(HTTPAuthorizationCredentials | None, credentials)
    presented = presented_token(request, bearer)
    if presented is None:
        tenant = await cast(Plane, request.app.state.plane).tenant(bearer)
        return Access(ingress, tenant, environment_id_or_404(environment_id))
    grant = await ingress.tokens.grant(presented.token, following=ingress.following)
    env_id = environment_id_or_404(environment_id)
    check_scope(grant, env_id, port)
    return Access(ingress, grant.tenant, env_id, (presented, grant))


async def _small_body(request: Request) -> bytes:
    return await read_body(request, plane(request).config.max_body_bytes)


FRAMES = (CommandStarted, OutputFrame, ExitFrame)


def _frame_schema(model: type[BaseModel]) -> JsonSchemaValue:
    """A frame's schema in place (an NDJSON line has no component of its own); frames nest no model."""
    schema = model.model_json_schema(by_alias=True)
    assert "$defs" not in schema, model
    return schema


# The decoded path parameters go into the Relay's URL, which takes no control character (httpx refuses it: the
# request failed with 500): they are declared, so anything else is a 422 naming them before any forwarding.
CommandId = Annotated[
    str, Path(pattern=COMMAND_ID, description="from POST .../commands (background) or the list of commands")
]
SandboxPath = Annotated[
    str,
    Query(
        min_length=1,
        pattern=NO_NUL,
        description="absolute, or relative to the home of ?user=; which files exist is the Environment's data",
    ),
]
User = Annotated[str | None, Query(pattern=ACCOUNT, description="act as this account of the sandbox")]


def _flag(description: str) -> Any:
    return Query(description=description)


@router.post(
    "/v1/environments/{environment_id}/commands",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "a foreground command: one JSON object per line (application/x-ndjson), as produced: "
            "CommandStarted, then OutputFrame objects, then the ExitFrame (a stream without it lost its "
            "connection)",
            "content": {"application/x-ndjson": {"schema": {"oneOf": [_frame_schema(m) for m in FRAMES]}}},
        },
        201: {"model": CommandStatus, "description": "a background command (background: true): its status, at once"},
    },
    openapi_extra=json_body(RunCommand),
    summary="Run a command; a foreground one streams NDJSON frames as output is produced",
)
async def run_command(request: Request, environment_id: EnvId, credentials: Credentials) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    body = await _small_body(request)  # a small JSON document: buffered, so a retry after a connect failure is safe
    # No read timeout: a command may be silent for long; its own timeoutSeconds bounds it, and a caller that
    # hangs up cancels it (execd kills a foreground command whose client has gone).
    return await a.forward(request, "/v1/commands", body=body, read_timeout=None)


@router.get("/v1/environments/{environment_id}/commands", response_model=CommandList, summary="List commands")
async def list_commands(request: Request, environment_id: EnvId, credentials: Credentials) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    return await a.forward(request, "/v1/commands", body=b"", read_timeout=None)


async def _command(
    request: Request, credentials: object, environment_id: str, command_id: str, action: str = ""
) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    path = f"/v1/commands/{command_id}" + (f"/{action}" if action else "")
    body = None if action == "stdin" else await _small_body(request)
    return await a.forward(request, path, body=body, read_timeout=None)


@router.get(
    "/v1/environments/{environment_id}/commands/{command_id}",
    response_model=CommandStatus,
    summary="A command's status",
)
async def get_command(
    request: Request, environment_id: EnvId, command_id: CommandId, credentials: Credentials
) -> StreamingResponse:
    return await _command(request, credentials, environment_id, command_id)


@router.delete(
    "/v1/environments/{environment_id}/commands/{command_id}",
    status_code=204,
    response_class=Response,
    responses={409: error_answer("still running: kill it first")},
    summary="Forget a finished command",
)
async def forget_command(
    request: Request, environment_id: EnvId, command_id: CommandId, credentials: Credentials
) -> StreamingResponse:
    return await _command(request, credentials, environment_id, command_id)


@router.get(
    "/v1/environments/{environment_id}/commands/{command_id}/output",
    response_model=CommandOutput,
    responses={409: error_answer("a foreground command keeps no output")},
    summary="A background command's kept output, from an offset",
)
async def command_output(
    request: Request,
    environment_id: EnvId,
    command_id: CommandId,
    credentials: Credentials,
    stream: Annotated[Literal["stdout", "stderr"], Query()] = "stdout",
    offset: Annotated[int, Query(ge=0, description="from this byte of the stream")] = 0,
    limit: Annotated[int, Query(ge=1, description="at most this many bytes")] = 1 << 20,
    encoding: Annotated[Encoding, Query()] = Encoding.UTF8,
) -> StreamingResponse:
    return await _command(request, credentials, environment_id, command_id, "output")


@router.post(
    "/v1/environments/{environment_id}/commands/{command_id}/kill",
    response_model=Killed,
    openapi_extra=json_body(KillCommand, required=False),
    summary="Send a signal to a command's process group (default SIGKILL)",
)
async def kill_command(
    request: Request, environment_id: EnvId, command_id: CommandId, credentials: Credentials
) -> StreamingResponse:
    return await _command(request, credentials, environment_id, command_id, "kill")


@router.post(
    "/v1/environments/{environment_id}/commands/{command_id}/stdin",
    response_model=StdinWritten,
    responses={
        409: error_answer("its stdin is not open (keepStdinOpen), closed, or not read"),
    },
    openapi_extra=raw_body("written to the command's stdin as it arrives (streamed)", required=False),
    summary="Write to a command's stdin (started with keepStdinOpen)",
)
async def command_stdin(
    request: Request,
    environment_id: EnvId,
    command_id: CommandId,
    credentials: Credentials,
    close: Annotated[bool, _flag("close its stdin after this body")] = False,
) -> StreamingResponse:
    return await _command(request, credentials, environment_id, command_id, "stdin")


@router.post(
    "/v1/environments/{environment_id}/commands/{command_id}/resize",
    response_model=Resized,
    responses={409: error_answer("no PTY, or it has exited")},
    openapi_extra=json_body(WindowSize),
    summary="Resize the terminal of a command run with pty",
)
async def resize_command(
    request: Request, environment_id: EnvId, command_id: CommandId, credentials: Credentials
) -> StreamingResponse:
    return await _command(request, credentials, environment_id, command_id, "resize")


async def _files(request: Request, credentials: object, environment_id: str, action: str = "") -> StreamingResponse:
    a = await _setup(request, credentials, environment_id)
    timeout = plane(request).config.relay_timeout_seconds
    # File contents stream through, never buffered here; the other operations carry no body worth keeping.
    body = None if request.method == "PUT" else await _small_body(request) if action else b""
    return await a.forward(request, "/v1/files" + (f"/{action}" if action else ""), body=body, read_timeout=timeout)


@router.get(
    "/v1/environments/{environment_id}/files",
    response_class=Response,
    responses={
        200: {"description": "the file's bytes, streamed", "content": {"application/octet-stream": {}}},
    },
    summary="Read a file",
)
async def read_file(
    request: Request, environment_id: EnvId, credentials: Credentials, path: SandboxPath, user: User = None
) -> StreamingResponse:
    return await _files(request, credentials, environment_id)


@router.put(
    "/v1/environments/{environment_id}/files",
    status_code=201,
    response_model=FileWritten,
    openapi_extra=raw_body("the file's new contents (streamed; readers see the old or the new file)"),
    summary="Write a file (atomically)",
)
async def write_file(
    request: Request,
    environment_id: EnvId,
    credentials: Credentials,
    path: SandboxPath,
    user: User = None,
    mode: Annotated[str, Query(pattern=r"^0*[0-7]{1,4}$", description="octal permissions")] = "644",
    mkdirs: Annotated[bool, _flag("make missing parent directories")] = False,
) -> StreamingResponse:
    return await _files(request, credentials, environment_id)


@router.delete(
    "/v1/environments/{environment_id}/files",
    status_code=204,
    response_class=Response,
    summary="Delete a file or directory",
)
async def delete_file(
    request: Request,
    environment_id: EnvId,
    credentials: Credentials,
    path: SandboxPath,
    user: User = None,
    recursive: Annotated[bool, _flag("a directory with its contents")] = False,
) -> StreamingResponse:
    return await _files(request, credentials, environment_id)


@router.get(
    "/v1/environments/{environment_id}/files/stat",
    response_model=FileStat,
    summary="Describe one entry (a symlink is not followed)",
)
async def stat_file(
    request: Request, environment_id: EnvId, credentials: Credentials, path: SandboxPath, user: User = None
) -> StreamingResponse:
    return await _files(request, credentials, environment_id, "stat")


@router.get("/v1/environments/{environment_id}/files/list", response_model=FileList, summary="List a directory")
async def list_files(
    request: Request, environment_id: EnvId, credentials: Credentials, path: SandboxPath, user: User = None
) -> StreamingResponse:
    return await _files(request, credentials, environment_id, "list")


@router.post(
    "/v1/environments/{environment_id}/files/mkdir",
    status_code=201,
    response_model=PathAnswer,
    summary="Make a directory",
)
async def make_directory(
    request: Request,
    environment_id: EnvId,
    credentials: Credentials,
    path: SandboxPath,
    user: User = None,
    parents: Annotated[bool, _flag("make missing parents too; an existing directory is fine")] = False,
) -> StreamingResponse:
    return await _files(request, credentials, environment_id, "mkdir")


@router.post(
    "/v1/environments/{environment_id}/files/rename",
    response_model=PathAnswer,
    summary="Rename (move) an entry; a file at the destination is replaced",
)
async def rename_file(
    request: Request,
    environment_id: EnvId,
    credentials: Credentials,
    path: SandboxPath,
    to: Annotated[str, Query(min_length=1, pattern=NO_NUL, description="the destination")],
    user: User = None,
) -> StreamingResponse:
    return await _files(request, credentials, environment_id, "rename")


@route(
    "/v1/environments/{environment_id}/ports/{port}/{path:path}",
    methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
    response_class=Response,
    responses={
        200: {"description": "the service's own answer, streamed", "content": {"*/*": {}}},
        "default": {"description": "the service's own answer, any status", "content": {"*/*": {}}},
        502: error_answer("nothing listens on the port (code port_unavailable)"),
    },
    summary="Proxy to a service the Environment listens on (inside its own network namespace)",
)
async def ports(
    request: Request,
    environment_id: EnvId,
    port: Annotated[int, Path(ge=1, le=65535)],
    path: Annotated[str, Path(pattern=r"^[^\x00-\x1f\x7f]*$", description="the service's path (may contain /)")],
    credentials: Credentials,
) -> StreamingResponse:
    a = await _setup(request, credentials, environment_id, port)
    timeout = plane(request).config.relay_timeout_seconds
    return await a.forward(request, f"/port/{port}/{_raw_rest(request, path)}", read_timeout=timeout)


def _raw_rest(conn: HTTPConnection, decoded: str) -> str:
    """The service's path as the client sent it (percent-encoded): the decoded ``{path}`` would be encoded
    again on the way and the service would see another path (``a%2Fb`` as ``a/b``, ``%25`` as ``%``)."""
    parts = conn.scope.get("raw_path", b"").split(b"/", 6)  # '', v1, environments, ID, ports, PORT, rest
    return parts[6].decode("latin-1") if len(parts) == 7 else quote(decoded)


def _bearer(websocket: WebSocket) -> HTTPAuthorizationCredentials | None:
    """The ``Authorization: Bearer`` credentials, as the HTTP routes' security dependency reads them."""
    scheme, _, value = websocket.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return HTTPAuthorizationCredentials(scheme=scheme, credentials=value.strip())


async def ports_websocket(websocket: WebSocket) -> None:
    """A WebSocket to the service on ``port``: the same checks as the HTTP route (SEC-4: tenant key or endpoint
    token, checked before any lookup or wake-up), then the Relay, which opens it on the sandbox's port.
    Refusals are HTTP answers to the upgrade (the error body of the HTTP route)."""
    params = websocket.path_params
    port = str(params["port"])
    try:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise InvalidInputError("port", "must be 1-65535")
        a = await _setup(websocket, _bearer(websocket), str(params["environment_id"]), int(port))
        path = f"/port/{int(port)}/{_raw_rest(websocket, str(params['path']))}"
        await a.ingress.forward_websocket(websocket, a.tenant, a.env_id, path)
    except AdxError as exc:
        await deny(websocket, error_response(exc))


router.add_api_websocket_route("/v1/environments/{environment_id}/ports/{port}/{path:path}", ports_websocket)
