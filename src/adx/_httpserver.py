"""One bounded HTTP/1.1 server for ADX's small internal endpoints: sandboxd's control API and the agent worker's
health endpoint. (execd keeps its own hand-written server, ``adx.execd._http``: it runs in every sandbox's PID 1,
where each imported module is resident memory paid per sandbox; this one is for daemons that run once a host.)

h11 (a dependency already, through uvicorn) does the parsing; this module adds what h11 leaves to its caller,
so that no peer can make a server buffer or wait without bound:

- the request line and the whole head are capped in bytes (h11 refuses a head past ``head_bytes`` after at
  most one read more; the request line is checked as it arrives), the number of header fields too;
- the body is capped (a declared ``Content-Length`` over the cap is refused before any of it is read; a
  chunked body as soon as it passes the cap);
- the head must arrive within ``head_seconds`` of its first byte (a peer trickling an endless header gets 408),
  the body within ``body_seconds``, a response must be taken within ``write_seconds``, and a kept-alive
  connection idle for ``idle_seconds`` is closed.

A refused request is answered with the limit's status (400, 408, 413, 414, 431) and the connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

import h11

__all__ = [
    "HttpLimits",
    "HttpRequest",
    "HttpResponse",
    "Refusal",
    "encode_response",
    "refuse_connection",
    "serve_http",
]

_READ = 1 << 16


@dataclass(frozen=True, slots=True)
class HttpLimits:
    request_line_bytes: int = 8 << 10
    head_bytes: int = 64 << 10  # request line and headers together
    header_count: int = 100
    body_bytes: int = 1 << 20
    head_seconds: float = 30.0  # from the head's first byte to its end
    body_seconds: float = 30.0
    write_seconds: float = 30.0
    idle_seconds: float = 300.0  # before a kept-alive connection's next request
    linger_seconds: float = 1.0  # after a refusal, unread bytes are read and dropped this long


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]  # names lower-case
    body: bytes


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str = "application/json"


#: Renders the body of a refused request: (status, what was wrong) -> body (the caller's error format).
Refusal = Callable[[int, str], bytes]
Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _headers(response: HttpResponse, keep_alive: bool) -> list[tuple[str, str]]:
    return [
        ("Content-Type", response.content_type),
        ("Content-Length", str(len(response.body))),
        ("Connection", "keep-alive" if keep_alive else "close"),
    ]


def encode_response(response: HttpResponse, *, keep_alive: bool = False) -> bytes:
    """A whole response outside any request cycle (e.g. a refusal written before a request is read)."""
    head = f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in _headers(response, keep_alive))
    return head.encode("latin-1") + b"\r\n" + response.body


class _Connection:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: HttpLimits, keep_alive: bool
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.limits = limits
        self.keep_alive = keep_alive
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.head_bytes)
        self.line_bytes = 0  # of the current request line so far; -1 once its end was seen

    async def _read(self) -> bytes:
        data = await self.reader.read(_READ)
        if self.line_bytes >= 0 and self.h11.their_state is h11.IDLE:
            end = data.find(b"\n")
            seen = self.line_bytes + (len(data) if end < 0 else end)
            if seen > self.limits.request_line_bytes:
                raise _Refused(414, f"request line longer than {self.limits.request_line_bytes} bytes")
            self.line_bytes = seen if end < 0 else -1
        return data

    async def _event(self) -> object:
        while (event := self.h11.next_event()) is h11.NEED_DATA:
            self.h11.receive_data(await self._read())
        return event

    async def request(self) -> HttpRequest | None:
        """The next whole request; None when the peer closed or stayed idle between requests."""
        self.line_bytes = 0
        if not self.h11.trailing_data[0]:  # nothing pipelined: wait (idle) for the first byte
            try:
                async with asyncio.timeout(self.limits.idle_seconds):
                    data = await self._read()
            except TimeoutError:
                return None
            self.h11.receive_data(data)
            if not data:
                return None
        try:
            async with asyncio.timeout(self.limits.head_seconds):
                head = await self._event()
        except TimeoutError:
            raise _Refused(408, f"request head not received within {self.limits.head_seconds:g}s") from None
        if isinstance(head, h11.ConnectionClosed):
            return None
        if not isinstance(head, h11.Request):
            raise _Refused(400, "expected a request")
        if len(head.headers) > self.limits.header_count:
            raise _Refused(431, f"more than {self.limits.header_count} header fields")
        # h11 caps a head still arriving; one that came whole in a single read is measured here (as parsed:
        # the line breaks and ": " counted, the whitespace around values not).
        size = len(head.method) + len(head.target) + 12 + sum(len(n) + len(v) + 4 for n, v in head.headers)
        if size > self.limits.head_bytes:
            raise _Refused(431, f"request head over {self.limits.head_bytes} bytes")
        headers = tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in head.headers)
        length = next((int(v) for n, v in headers if n == "content-length"), None)  # h11 checked the digits
        if length is not None and length > self.limits.body_bytes:
            raise _Refused(413, f"body of {length} bytes is over the limit of {self.limits.body_bytes}")
        body = bytearray()
        try:
            async with asyncio.timeout(self.limits.body_seconds):
                while not isinstance(event := await self._event(), h11.EndOfMessage):
                    if not isinstance(event, h11.Data):
                        raise _Refused(400, "incomplete request body")
                    body += event.data
                    if len(body) > self.limits.body_bytes:
                        raise _Refused(413, f"body over the limit of {self.limits.body_bytes} bytes")
        except TimeoutError:
            raise _Refused(408, f"request body not received within {self.limits.body_seconds:g}s") from None
        return HttpRequest(head.method.decode("ascii"), head.target.decode("latin-1"), headers, bytes(body))

    async def send(self, response: HttpResponse) -> None:
        # h11 turns "keep-alive" into "close" itself when the peer asked for that or speaks HTTP/1.0.
        head = h11.Response(
            status_code=response.status,
            headers=_headers(response, self.keep_alive),
            reason=HTTPStatus(response.status).phrase.encode(),
        )
        data = b"".join(self.h11.send(event) or b"" for event in (head, h11.Data(data=response.body)))
        self.writer.write(data + (self.h11.send(h11.EndOfMessage()) or b""))
        async with asyncio.timeout(self.limits.write_seconds):
            await self.writer.drain()


async def refuse_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: HttpResponse, limits: HttpLimits
) -> None:
    """Answer ``response`` and end the connection (the caller closes the writer).

    After the answer: half-close, then read and drop what the peer still sends for ``linger_seconds``. Closing
    a socket with unread bytes makes the kernel send RST, which can destroy the answer before the peer reads
    it."""
    with contextlib.suppress(ConnectionError, OSError, TimeoutError):
        writer.write(encode_response(response))
        async with asyncio.timeout(limits.write_seconds):
            await writer.drain()
        writer.write_eof()
        async with asyncio.timeout(limits.linger_seconds):
            while await reader.read(_READ):
                pass


async def serve_http(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: Handler,
    refusal: Refusal,
    limits: HttpLimits,
    *,
    keep_alive: bool = True,
) -> None:
    """Serve one connection: requests in turn (kept alive while both sides want it), then close it.

    ``handler`` answers a whole request (its exceptions are the caller's to turn into responses: one escaping
    here drops the connection)."""
    conn = _Connection(reader, writer, limits, keep_alive)
    try:
        while True:
            try:
                request = await conn.request()
            except h11.RemoteProtocolError as exc:
                raise _Refused(exc.error_status_hint, str(exc)) from None
            if request is None:
                return
            await conn.send(await handler(request))
            if conn.h11.our_state is not h11.DONE or conn.h11.their_state is not h11.DONE:
                return  # one side asked to close (Connection: close, HTTP/1.0, keep_alive=False)
            conn.h11.start_next_cycle()
    except _Refused as refused:
        if conn.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            response = HttpResponse(refused.status, refusal(refused.status, refused.message))
            await refuse_connection(reader, writer, response, limits)
    except (ConnectionError, TimeoutError, h11.LocalProtocolError):
        return  # a peer gone or not reading: nothing to answer
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
