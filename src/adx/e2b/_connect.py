"""The Connect protocol (connectrpc.com/docs/protocol) with the JSON codec, as envd's clients speak it.

Unary calls: ``POST /<package>.<Service>/<Method>``, ``Content-Type: application/json``, one JSON message each way;
an error is a non-200 status with ``{"code": "<connect code>", "message": "..."}``.

Streaming calls: ``Content-Type: application/connect+json``; each message is an *envelope*: one flag byte, a
4-byte big-endian length, then that many bytes of JSON. The last envelope of a response has flag 0x02 (end of
stream) and holds ``{}`` or ``{"error": {"code", "message"}}``; a streaming response is always HTTP 200.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from adx.errors import AdxError, ConflictError, InvalidInputError, NoCapacityError, NotFoundError, UnavailableError
from adx.gateway import Unauthenticated

STREAM_TYPE = "application/connect+json"
END_STREAM = 0x02
COMPRESSED = 0x01
MAX_MESSAGE = 16 << 20

# Connect code -> HTTP status of a unary error (the protocol's own table).
HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class RpcError(Exception):
    """An error answered as a Connect error: ``code`` is one of :data:`HTTP_STATUS`'s keys."""

    def __init__(self, code: str, message: str) -> None:
        assert code in HTTP_STATUS, code
        super().__init__(message)
        self.code = code
        self.message = message

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def rpc_error(exc: AdxError) -> RpcError:
    """An ADX error family as the nearest Connect code."""
    if isinstance(exc, Unauthenticated):
        return RpcError("unauthenticated", exc.message)
    if isinstance(exc, InvalidInputError):
        return RpcError("invalid_argument", exc.message)
    if isinstance(exc, NotFoundError):
        return RpcError("not_found", exc.message)
    if isinstance(exc, NoCapacityError):  # a conflict inside the cluster, "try again later" to a caller (503)
        return RpcError("unavailable", exc.message)
    if isinstance(exc, ConflictError):
        return RpcError("failed_precondition", exc.message)
    if isinstance(exc, UnavailableError):
        return RpcError("unavailable", exc.message)
    return RpcError("unavailable" if exc.code == "relay_timeout" else "unknown", exc.message)


def envelope(message: Mapping[str, object], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(error: RpcError | None = None) -> bytes:
    return envelope({"error": error.body()} if error is not None else {}, END_STREAM)


def is_streaming(request: Request) -> bool:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower() == STREAM_TYPE


def error_response(request: Request, error: RpcError) -> Response:
    """The error as the caller's protocol expects it: end-of-stream for streams, a status for unary calls."""
    if is_streaming(request):
        return Response(end_stream(error), media_type=STREAM_TYPE)
    return JSONResponse(error.body(), status_code=HTTP_STATUS[error.code])


def _decode(data: bytes) -> dict[str, object]:
    """One request message as a JSON object, untyped until the RPC reads it (``adx.e2b._messages``)."""
    try:
        value = json.loads(data) if data.strip() else {}
    except ValueError as exc:
        raise RpcError("invalid_argument", f"the request message is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RpcError("invalid_argument", "the request message must be a JSON object")
    return value


async def envelopes(request: Request) -> AsyncIterator[dict[str, object]]:
    """The messages of a streaming request body, one at a time as they arrive."""
    buffer = bytearray()
    async for chunk in request.stream():
        buffer += chunk
        while len(buffer) >= 5:
            flags, size = struct.unpack(">BI", buffer[:5])
            if size > MAX_MESSAGE:
                raise RpcError("resource_exhausted", f"a request message is larger than {MAX_MESSAGE} bytes")
            if len(buffer) < 5 + size:
                break
            data = bytes(buffer[5 : 5 + size])
            del buffer[: 5 + size]
            if flags & COMPRESSED:
                raise RpcError("internal", "compressed request messages are not accepted")
            if flags & END_STREAM:
                return
            yield _decode(data)
    if buffer:
        raise RpcError("invalid_argument", "the request stream ended inside a message")


async def single_message(request: Request) -> dict[str, object]:
    """The one request message of a unary or server-streaming call."""
    if is_streaming(request):
        async for message in envelopes(request):
            return message
        raise RpcError("invalid_argument", "the request stream holds no message")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_MESSAGE:
            raise RpcError("resource_exhausted", f"the request message is larger than {MAX_MESSAGE} bytes")
    return _decode(bytes(body))


def timeout_seconds(request: Request) -> float | None:
    """The call's deadline (``Connect-Timeout-Ms``), if the client set one."""
    raw = request.headers.get("connect-timeout-ms")
    if raw is None or not raw.isdigit() or int(raw) <= 0:
        return None
    return int(raw) / 1000.0
