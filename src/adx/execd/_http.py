"""A minimal HTTP/1.1 server on asyncio streams (standard library only).

Why not a framework, nor the shared ``adx._httpserver`` (h11) that sandboxd's API and the agent worker's health
endpoint use: execd runs in every sandbox and its idle memory is paid per sandbox (fastapi/pydantic cost tens
of MiB; h11 and dataclasses are more modules resident in every PID 1), and it streams responses. What is
implemented is what execd needs: request line and headers, ``Content-Length`` and ``chunked`` request bodies
read incrementally, fixed-length and chunked (streamed) responses, keep-alive, and backpressure through
``drain()``. No TLS (Unix sockets only), no pipelining guarantees beyond serial.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeAlias, TypedDict

from adx.execd._accounts import AccountError, Identity, ensure_account

__all__ = ["BodyReader", "HttpError", "Request", "Response", "serve_connection"]

log = logging.getLogger("adx.execd.http")

MAX_HEAD = 64 * 1024
#: Keep-alive connections idle longer than this are closed (a slow client cannot pin a connection forever).
IDLE_TIMEOUT = 120.0
CHUNK = 64 * 1024
DISCARD_LIMIT = 1 << 20
#: A request body that stalls this long fails (408): an abandoned upload must not count as activity forever.
BODY_IDLE_TIMEOUT = 60.0  # the defaults are ExecdOptions'; _main sets both from the options
#: A client that reads nothing of a response for this long is dropped, for the same reason.
WRITE_TIMEOUT = 300.0

REASONS = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


#: A request body: JSON the client sent, checked field by field where a route reads it.
JsonObject: TypeAlias = dict[str, object]


class ErrorWire(TypedDict):
    code: str
    message: str
    details: dict[str, object]


class ErrorBody(TypedDict):
    """An error answer, shaped like the API's (``adx.errors``)."""

    error: ErrorWire


class HttpError(Exception):
    """Becomes ``{"error": {"code", "message", "details"}}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str, details: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = dict(details or {})

    def body(self) -> ErrorBody:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


def invalid(field: str, reason: str) -> HttpError:
    """400 naming the offending field, shaped like :class:`adx.errors.InvalidInputError`."""
    return HttpError(400, "invalid_input", f"{field}: {reason}", {"field": field, "reason": reason})


def strict_fields(body: Mapping[str, object], allowed: frozenset[str]) -> None:
    """A request body names only fields it may have: else a 400 naming the first other one."""
    for key in body:
        if key not in allowed:
            raise invalid(key, "unknown field")


def account(user: Any, field: str = "user") -> Identity:
    """The account a request names (E2B's ``user`` is created on its first use): else a 400 naming ``field``."""
    if not isinstance(user, str):
        raise invalid(field, "must be an account name or a numeric uid")
    try:
        return ensure_account(user, field)
    except AccountError as exc:
        raise invalid(field, exc.reason) from None


class BodyReader:
    """Reads a request body incrementally; never buffers more than one chunk of it."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        length: int | None,
        chunked: bool,
        writer: asyncio.StreamWriter | None = None,
    ) -> None:
        self._reader = reader
        self._remaining = length or 0  # for Content-Length bodies; for chunked: left in the current chunk
        self._chunked = chunked
        self.done = not chunked and not length
        # "Expect: 100-continue" clients (curl, for large uploads) wait for this before sending the body;
        # it is sent only when the handler actually reads, so an early error answer costs no upload.
        self._continue_to = writer

    async def read(self, n: int = CHUNK) -> bytes:
        """Up to ``n`` bytes; ``b""`` at the end of the body."""
        if self.done:
            return b""
        if self._continue_to is not None:
            self._continue_to.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._continue_to = None
        if self._chunked and self._remaining == 0:
            await self._next_chunk()
            if self.done:
                return b""
        data = await self._timed(self._reader.read(min(n, self._remaining)))
        if not data:
            raise HttpError(400, "invalid_request", "request body ended early")
        self._remaining -= len(data)
        if not self._chunked and self._remaining == 0:
            self.done = True
        elif self._chunked and self._remaining == 0 and await self._timed(self._reader.readexactly(2)) != b"\r\n":
            raise HttpError(400, "invalid_request", "malformed chunked body")
        return data

    @staticmethod
    async def _timed(awaitable: Awaitable[bytes]) -> bytes:
        try:
            return await asyncio.wait_for(awaitable, BODY_IDLE_TIMEOUT)
        except TimeoutError:
            raise HttpError(408, "request_timeout", f"no request body data for {BODY_IDLE_TIMEOUT:.0f}s") from None

    async def _next_chunk(self) -> None:
        try:
            line = await self._timed(self._reader.readuntil(b"\r\n"))
            size = int(line.split(b";", 1)[0].strip(), 16)
        except (ValueError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            raise HttpError(400, "invalid_request", "malformed chunked body") from None
        if size < 0:
            raise HttpError(400, "invalid_request", "malformed chunked body")
        if size == 0:
            # Trailers (ignored) end with an empty line.
            while (await self._timed(self._reader.readuntil(b"\r\n"))) != b"\r\n":
                pass
            self.done = True
        self._remaining = size

    async def read_all(self, limit: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while chunk := await self.read():
            total += len(chunk)
            if total > limit:
                raise HttpError(413, "payload_too_large", f"request body is larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def json(self, limit: int = 1 << 20) -> JsonObject:
        raw = await self.read_all(limit)
        if not raw.strip():
            return {}
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise invalid("body", f"not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise invalid("body", "must be a JSON object")
        return value


def unquote(text: str, plus: bool = False) -> str:
    """Percent-decoding as UTF-8 (what urllib.parse.unquote does, without importing it: ~0.5 MiB per sandbox)."""
    if plus:
        text = text.replace("+", " ")
    if "%" not in text:
        return text
    parts = text.split("%")
    out = bytearray(parts[0].encode())
    for part in parts[1:]:
        try:
            out += bytes.fromhex(part[:2]) if len(part) >= 2 else b"%" + part.encode()
            out += part[2:].encode()
        except ValueError:
            out += b"%" + part.encode()
    return out.decode("utf-8", "replace")


def parse_target(target: str) -> tuple[str, dict[str, str]]:
    """Request target -> (decoded path, query dict; the last value of a repeated key wins)."""
    path, _, query = target.partition("?")
    path = path.partition("#")[0]
    params: dict[str, str] = {}
    for pair in query.partition("#")[0].split("&"):
        if pair:
            key, _, value = pair.partition("=")
            params[unquote(key, plus=True)] = unquote(value, plus=True)
    return unquote(path), params


class Request:
    def __init__(
        self, method: str, target: str, headers: dict[str, str], body: BodyReader, reader: asyncio.StreamReader
    ) -> None:
        self.method = method
        self.path, self.query = parse_target(target)
        self.headers = headers
        self.body = body
        self._reader = reader

    def client_gone(self) -> bool:
        """True once the client closed its side. Only meaningful after the body has been read.

        The stream protocol records EOF as soon as the peer shuts down, whether or not we are reading, so
        a long-running request can poll this to notice an abandoned client that sends nothing.
        """
        return self._reader.at_eof()


class Response:
    def __init__(self, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        self._writer = writer
        self.keep_alive = keep_alive
        self.started = False
        self.finished = False
        self._chunked = False
        self.status = 0

    async def _drain(self) -> None:
        try:
            await asyncio.wait_for(self._writer.drain(), WRITE_TIMEOUT)
        except TimeoutError:
            raise ConnectionAbortedError(f"client read nothing for {WRITE_TIMEOUT:.0f}s") from None

    def _head(self, status: int, headers: dict[str, str]) -> bytes:
        self.status = status
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
        if not self.keep_alive:
            headers["Connection"] = "close"
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
        headers = {"Content-Length": str(len(body))}
        if body:
            headers["Content-Type"] = content_type
        self.started = True
        self._writer.write(self._head(status, headers) + body)
        await self._drain()
        self.finished = True

    async def send_json(self, status: int, value: Any) -> None:
        await self.send(status, json.dumps(value, separators=(",", ":")).encode())

    async def start(
        self, status: int, content_type: str, length: int | None = None, extra: dict[str, str] | None = None
    ) -> None:
        """Send the head (``extra``: more headers); with ``length=None`` the body is chunked (streamed as produced)."""
        headers = {"Content-Type": content_type, **(extra or {})}
        if length is None:
            self._chunked = True
            headers["Transfer-Encoding"] = "chunked"
        else:
            headers["Content-Length"] = str(length)
        self.started = True
        self._writer.write(self._head(status, headers))
        await self._drain()

    async def write(self, data: bytes) -> None:
        if not data:
            return
        if self._chunked:
            self._writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self._writer.write(data)
        # drain() is the backpressure: a slow client slows the producer instead of growing our buffers.
        await self._drain()

    async def end(self) -> None:
        if self._chunked:
            self._writer.write(b"0\r\n\r\n")
            await self._drain()
        self.finished = True


Handler = Callable[[Request, Response], Awaitable[None]]


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]] | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise HttpError(400, "invalid_request", "incomplete request head") from None
        return None  # the client closed an idle keep-alive connection
    except asyncio.LimitOverrunError:
        raise HttpError(431, "head_too_large", f"request head is larger than {MAX_HEAD} bytes") from None
    try:
        text = raw.decode("latin-1")
        request_line, *header_lines = text.rstrip("\r\n").split("\r\n")
        method, target, version = request_line.split(" ")
    except ValueError:
        raise HttpError(400, "invalid_request", "malformed request line") from None
    if not version.startswith("HTTP/1."):
        raise HttpError(400, "invalid_request", f"unsupported protocol {version!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "invalid_request", "malformed header line")
        headers[name.lower()] = value.strip()
    if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    return method, target, headers


async def _discard(body: BodyReader) -> bool:
    """Read and drop what the handler left of a body (e.g. after an early error response).

    Closing a socket with unread input makes the kernel send RST, which can destroy the response before the
    client reads it; so a modest remainder is drained. A large or slow one is not worth it: the caller closes.
    """
    if body._continue_to is not None:
        return False  # the client never got "100 Continue", so it may never send the body: just close
    left = DISCARD_LIMIT
    try:
        async with asyncio.timeout(2.0):
            while left > 0 and (chunk := await body.read()):
                left -= len(chunk)
    except (TimeoutError, HttpError):
        return False
    return body.done


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
    """Serve requests on one connection until the client closes it or a response forbids reuse."""
    try:
        while True:
            resp = Response(writer, keep_alive=False)
            try:
                # An idle keep-alive connection (or a client dribbling its head) is closed after IDLE_TIMEOUT.
                head = await asyncio.wait_for(_read_head(reader), IDLE_TIMEOUT)
                if head is None:
                    return
                method, target, headers = head
                chunked = "chunked" in headers.get("transfer-encoding", "").lower()
                length: int | None = None
                if not chunked and "content-length" in headers:
                    try:
                        length = int(headers["content-length"])
                        if length < 0:
                            raise ValueError
                    except ValueError:
                        raise HttpError(400, "invalid_request", "invalid Content-Length") from None
                expect = headers.get("expect", "").lower() == "100-continue"
                body = BodyReader(reader, length, chunked, writer if expect else None)
                req = Request(method, target, headers, body, reader)
                resp.keep_alive = headers.get("connection", "").lower() != "close"
            except HttpError as exc:
                await resp.send_json(exc.status, exc.body())
                return
            except TimeoutError:
                return
            await handler(req, resp)
            if not resp.finished:
                return  # the handler aborted mid-response: the connection's framing is lost
            if not body.done and not await _discard(body):
                return
            if not resp.keep_alive:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # the client went away; nothing to answer
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
