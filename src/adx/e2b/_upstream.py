"""Calls to an Environment's execd through the Ingress (``Ingress.forward``: tenant-scoped route, Relay, execd).

Every E2B data-plane call becomes one or more of these, so the Relay counts them (idle detection) and the
route is resolved as the tenant the access token names (SEC-2/SEC-4) exactly like ``/v1`` data-plane calls.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, TypedDict, Unpack
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message

from adx.e2b._connect import RpcError
from adx.ingress import Ingress


def _request(
    method: str, query: dict[str, str], content_type: str | None, body: AsyncIterator[bytes] | None
) -> Request:
    """A request as ``Ingress.forward`` reads it: method, query, headers and (optionally streamed) body."""
    headers = [(b"content-type", content_type.encode())] if content_type else []
    scope = {
        "type": "http",
        "method": method,
        "path": "/",
        "raw_path": b"/",
        "root_path": "",
        "query_string": urlencode(query).encode(),
        "headers": headers,
        "http_version": "1.1",
        "scheme": "http",
        "server": None,
        "client": None,
    }

    async def receive() -> Message:
        if body is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        try:
            chunk = await anext(body)
        except StopAsyncIteration:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    return Request(scope, receive)


class WindowBody(TypedDict):
    """A terminal's size as execd takes it (``pty`` of a command, ``POST .../resize``)."""

    rows: int
    cols: int


class CommandBody(TypedDict, total=False):
    """execd's ``POST /v1/commands`` body, the fields the E2B API sends (``adx.model.RunCommand`` states them all;
    the path rules are execd's, so a relative ``cwd`` goes through to be resolved in the user's home)."""

    argv: list[str]
    background: bool
    user: str
    cwd: str
    env: dict[str, str]
    timeoutSeconds: float
    encoding: Literal["utf-8", "base64"]
    pty: WindowBody
    keepStdinOpen: bool


class Send(TypedDict, total=False):
    """What a call to execd sends besides its method and path."""

    query: dict[str, str] | None
    json_body: object  # sent as JSON (instead of ``content``)
    content: bytes | AsyncIterator[bytes]
    content_type: str | None


@dataclass
class Execd:
    """One Environment's execd, as one tenant sees it."""

    ingress: Ingress
    tenant: str
    environment_id: str

    async def open(
        self, method: str, path: str, *, read_timeout: float | None = None, **send: Unpack[Send]
    ) -> Response:
        """The execd response, unread: the caller streams ``body_iterator`` and must call :func:`close`.

        ``content`` given as bytes is sent whole (a retry after a failed connect stays safe); as an iterator
        it is streamed through.
        """
        content, content_type = send.get("content", b""), send.get("content_type")
        if send.get("json_body") is not None:
            content, content_type = json.dumps(send["json_body"]).encode(), "application/json"
        stream = None if isinstance(content, bytes) else content
        body = content if isinstance(content, bytes) else None
        request = _request(method, send.get("query") or {}, content_type, stream)
        return await self.ingress.forward(
            request, self.tenant, self.environment_id, path, body=body, read_timeout=read_timeout
        )

    async def call(self, method: str, path: str, **send: Unpack[Send]) -> tuple[int, bytes]:
        """The whole execd answer: (status, body)."""
        response = await self.open(method, path, **send)
        return response.status_code, await read_all(response)


async def chunks(response: Response) -> AsyncIterator[bytes]:
    """The body of an execd answer as it arrives (the Ingress returns small answers already read)."""
    if isinstance(response, StreamingResponse):
        async for chunk in response.body_iterator:
            yield chunk if isinstance(chunk, bytes) else str(chunk).encode()
    elif response.body:
        yield bytes(response.body)


async def read_all(response: Response) -> bytes:
    try:
        parts = [chunk async for chunk in chunks(response)]
    finally:
        await close(response)
    return b"".join(parts)


async def close(response: Response) -> None:
    if response.background is not None:
        await response.background()


def execd_error(body: bytes) -> tuple[str, str]:
    """(code, message) of an execd error body ``{"error": {"code", "message"}}``."""
    try:
        error = json.loads(body).get("error") or {}
        return str(error.get("code", "unknown")), str(error.get("message", ""))
    except (ValueError, AttributeError):
        return "unknown", body[:200].decode("utf-8", "replace")


_STATUS_CODES = {
    400: "invalid_argument",
    403: "permission_denied",
    404: "not_found",
    409: "failed_precondition",
    429: "resource_exhausted",  # a bound of the sandbox (e.g. its 128 watchers)
}


def rpc_error_of(status: int, body: bytes, *, conflict: str = "failed_precondition") -> RpcError:
    """An execd error answer as a Connect error."""
    code, message = execd_error(body)
    if status == 409:
        return RpcError(conflict, message)
    if status == 503:
        return RpcError("unavailable", message)
    return RpcError(_STATUS_CODES.get(status, "internal"), message or f"execd answered {status} ({code})")
