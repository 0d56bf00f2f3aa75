"""The Ingress's HTTP/1.1 client to the nodes' Relays: h11 on pooled mutual-TLS connections.

Why not httpx: on the command path httpx's pool, anyio and stream layers were ~45 % of the API process's busy
time (docs/performance.md, bench/bench_hops.py); this client does what the Ingress needs and nothing else:
one request at a time per connection, bodies streamed both ways, idle connections kept per Relay address for
``keepalive_expiry`` seconds (shorter than the Relay's own keep-alive, so the server never closes first).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h11

#: Idle connections kept per Relay address (more than enough for serial traffic; bursts open new ones).
MAX_IDLE_PER_ADDRESS = 32
_CHUNK = 65536
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class RelayConnectError(Exception):
    """Connecting (TCP or TLS handshake) failed: nothing of the request was sent."""


class RelayTimeoutError(Exception):
    """The Relay did not answer in time; the request may have reached it."""


class RelayTransportError(Exception):
    """The connection failed after the request began; it may have reached the Relay."""


@dataclass(frozen=True)
class RelayRequest:
    """One request to a node's Relay: ``target`` is the path (and query) under it, ``content`` a buffered body
    (sent with its length) or a stream (sent with the caller's length, else chunked)."""

    method: str
    address: str  # host:port of the Relay
    target: str
    headers: list[tuple[str, str]]
    content: bytes | AsyncIterator[bytes]


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h11: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0

    def reusable(self, now: float, expiry: float) -> bool:
        return (
            now - self.idle_since < expiry
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and self.h11.our_state is h11.IDLE
        )

    def close(self) -> None:
        self.writer.close()


class RelayResponse:
    """A response whose body is read as it arrives; ``aclose`` (always) returns or closes the connection."""

    def __init__(
        self,
        client: RelayClient,
        address: str,
        conn: _Connection,
        status_code: int,
        headers: list[tuple[str, str]],
        read_timeout: float | None,
    ) -> None:
        self._client = client
        self._address = address
        self._conn: _Connection | None = conn
        self._read_timeout = read_timeout
        self.status_code = status_code
        self.headers = headers

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        try:
            while True:
                event = await self._client._next_event(conn, self._read_timeout)
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    self._finished(conn)
                    return
                else:  # ConnectionClosed before the end
                    raise RelayTransportError("the Relay closed the connection in the middle of the answer")
        finally:
            await self.aclose()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    def _finished(self, conn: _Connection) -> None:
        self._conn = None
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            conn.h11.start_next_cycle()
            self._client._release(self._address, conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:  # not read to its end: the connection is in an unknown state
            conn.close()


class RelayClient:
    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        *,
        timeout: float,
        connect_timeout: float,
        keepalive_expiry: float = 30.0,
    ) -> None:
        self._ssl = ssl_context
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.keepalive_expiry = keepalive_expiry
        self._idle: dict[str, list[_Connection]] = {}

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    def _release(self, address: str, conn: _Connection) -> None:
        idle = self._idle.setdefault(address, [])
        if len(idle) >= MAX_IDLE_PER_ADDRESS:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def _connect(self, address: str) -> _Connection:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), ssl=self._ssl, server_hostname=host, limit=_CHUNK),
                self.connect_timeout,
            )
        except TimeoutError:
            raise RelayConnectError(f"connecting took longer than {self.connect_timeout:g}s") from None
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise RelayConnectError(str(exc) or type(exc).__name__) from None
        return _Connection(reader, writer)

    async def open_stream(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new mutual-TLS connection of its own (never pooled: a WebSocket keeps it until it closes)."""
        conn = await self._connect(address)
        return conn.reader, conn.writer

    def _pooled(self, address: str) -> _Connection | None:
        idle = self._idle.get(address)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have expired
            if conn.reusable(now, self.keepalive_expiry):
                return conn
            conn.close()
        return None

    async def _next_event(
        self, conn: _Connection, within: float | None
    ) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        while True:
            try:
                event = conn.h11.next_event()
            except h11.RemoteProtocolError as exc:
                conn.close()
                raise RelayTransportError(f"the Relay's answer is not valid HTTP: {exc}") from None
            if event is not h11.NEED_DATA:
                return event
            try:
                read = conn.reader.read(_CHUNK)
                data = await (read if within is None else asyncio.wait_for(read, within))
            except TimeoutError:
                conn.close()
                raise RelayTimeoutError(f"no data from the Relay within {within:g}s") from None
            except OSError as exc:
                conn.close()
                raise RelayTransportError(str(exc) or type(exc).__name__) from None
            conn.h11.receive_data(data)

    async def send(self, request: RelayRequest, *, read_timeout: float | None) -> RelayResponse:
        """Send one request; the answer's head is read, its body is left to ``aiter_raw``/``aread``.

        A pooled connection the Relay closed meanwhile is replaced once for an idempotent, buffered request.
        Raises RelayConnectError (nothing sent), RelayTimeoutError or RelayTransportError."""
        for attempt in (1, 2):
            conn = self._pooled(request.address)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(request.address)
            try:
                return await self._exchange(conn, request, read_timeout)
            except RelayTransportError:
                # A kept connection the Relay closed just as it was reused: sent again on a new connection, but
                # only an idempotent request with a buffered body (a command must never run twice).
                if attempt == 1 and reused and request.method in _IDEMPOTENT and isinstance(request.content, bytes):
                    continue
                raise
        raise AssertionError("unreachable")

    async def _exchange(self, conn: _Connection, request: RelayRequest, read_timeout: float | None) -> RelayResponse:
        address, headers, content = request.address, request.headers, request.content
        framing = [("content-length", str(len(content)))] if isinstance(content, bytes) else []
        if not framing:
            declared = next((v for k, v in headers if k.lower() == "content-length"), None)
            framing = [("content-length", declared)] if declared is not None else [("transfer-encoding", "chunked")]
        head = [("host", address), *framing, *((k, v) for k, v in headers if k.lower() != "content-length")]
        try:
            head_event = h11.Request(method=request.method, target=request.target, headers=head)
            conn.writer.write(conn.h11.send(head_event) or b"")
            if isinstance(content, bytes):
                if content:
                    conn.writer.write(conn.h11.send(h11.Data(data=content)) or b"")
            else:
                async for chunk in content:
                    if chunk:
                        conn.writer.write(conn.h11.send(h11.Data(data=chunk)) or b"")
                        await asyncio.wait_for(conn.writer.drain(), self.timeout)
            conn.writer.write(conn.h11.send(h11.EndOfMessage()) or b"")
            await asyncio.wait_for(conn.writer.drain(), self.timeout)
        except TimeoutError:
            conn.close()
            raise RelayTimeoutError(f"the Relay did not take the request within {self.timeout:g}s") from None
        except (OSError, h11.LocalProtocolError) as exc:
            conn.close()
            raise RelayTransportError(str(exc) or type(exc).__name__) from None
        except BaseException:
            conn.close()
            raise
        try:
            while True:
                event = await self._next_event(conn, read_timeout)
                if isinstance(event, h11.Response):
                    break
                if isinstance(event, h11.ConnectionClosed):
                    conn.close()
                    raise RelayTransportError("the Relay closed the connection without answering")
                # an informational 1xx answer: wait for the real one
        except BaseException:
            conn.close()
            raise
        response_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers]
        return RelayResponse(self, address, conn, event.status_code, response_headers, read_timeout)
