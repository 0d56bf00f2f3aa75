"""WebSocket through port routing: a WebSocket client (wsproto) on an asyncio stream, and the bridge between the
WebSocket uvicorn accepted (ASGI ``websocket`` scope) and that client.

ASGI hands an application WebSocket messages, never the raw upgraded connection, so each hop (API/Ingress ->
Relay -> sandbox port) ends the WebSocket and opens the next one: messages (text or binary, any size up to
MAX_MESSAGE_BYTES), close codes and reasons, the chosen subprotocol and the handshake's headers are carried
across; extensions (per-message deflate) are negotiated per hop, pings are answered per hop.

Bounded: a message is read from one side only when the other side has taken the previous one, so each hop holds
at most one message (<= MAX_MESSAGE_BYTES) and the transports' buffers; a side that takes no bytes for
``stall_seconds`` while a message waits for it is closed (1011).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from starlette.responses import Response
from starlette.websockets import WebSocket
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

#: The largest message relayed (uvicorn's default ``ws_max_size``; the servers of every hop are set to it).
MAX_MESSAGE_BYTES = 16 << 20
#: A refused handshake's body is kept up to this size (an error answer, not a download).
REFUSAL_BODY_BYTES = 64 << 10
#: Silence from the upstream for this long sends a ping; no answer within as long again closes (as uvicorn does
#: towards the client: 20 s and 20 s).
PING_SECONDS = 20.0
#: A side that takes no bytes for this long while a message waits for it is closed (1011). Long: a busy
#: service may not read for a while (as ``relay_timeout_seconds``, 300 s, the Ingress's idle read/write limit).
STALL_SECONDS = 300.0
#: How long a close waits for the peer's close frame before the connection is dropped.
CLOSE_SECONDS = 5.0
_CHUNK = 65536
#: Headers of the handshake itself: each hop makes its own (wsproto), they are never copied across.
HANDSHAKE_HEADERS = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
        "connection",
        "upgrade",
        "host",
        "content-length",
        "transfer-encoding",
    }
)
#: Close codes that never go on the wire (RFC 6455 7.4.1): the peer is told "going away" instead.
_UNSENDABLE = frozenset({1004, 1005, 1006, 1015})


@dataclass(frozen=True)
class Refused:
    """The upstream answered the upgrade with an HTTP response (its status, headers and body) instead of 101."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class Closed:
    """The upstream's close (1006: its connection was lost without a close frame)."""

    code: int
    reason: str = ""


class UpstreamError(Exception):
    """The upstream's handshake failed (connection lost, timed out, or not HTTP/WebSocket)."""


def sendable(code: int) -> int:
    """A close code that may be sent on: a lost connection or an invalid code becomes 1001 (going away)."""
    if code in _UNSENDABLE or not (1000 <= code <= 1014 or 3000 <= code <= 4999):
        return 1001
    return code


@dataclass
class WebSocketClient:
    """One open client WebSocket: ``receive``, ``send``, ``close``; pings from the peer are answered."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    conn: WSConnection
    subprotocol: str | None = None
    #: The 101 answer's own headers (Set-Cookie of the user's service...), handshake headers left out.
    headers: list[tuple[str, str]] = field(default_factory=list)
    stall_seconds: float = STALL_SECONDS

    @classmethod
    async def open(
        cls,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        host: str,
        target: str,
        headers: list[tuple[str, str]],
        subprotocols: list[str],
        handshake_seconds: float,
        stall_seconds: float = STALL_SECONDS,
    ) -> WebSocketClient | Refused:
        """The opening handshake on a connected stream, within ``handshake_seconds`` (then UpstreamError)."""
        timeout = handshake_seconds
        conn = WSConnection(ConnectionType.CLIENT)
        extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers if k.lower() not in HANDSHAKE_HEADERS]
        try:
            return await asyncio.wait_for(
                cls._handshake(
                    reader,
                    writer,
                    conn,
                    Request(host, target, extra_headers=extra, subprotocols=subprotocols),
                    stall_seconds,
                ),
                timeout,
            )
        except TimeoutError:
            writer.close()
            raise UpstreamError(f"no answer to the WebSocket handshake within {timeout:g}s") from None
        except (OSError, LocalProtocolError, RemoteProtocolError) as exc:
            writer.close()
            raise UpstreamError(str(exc) or type(exc).__name__) from None

    @classmethod
    async def _handshake(
        cls,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: WSConnection,
        request: Request,
        stall_seconds: float,
    ) -> WebSocketClient | Refused:
        writer.write(conn.send(request))
        await writer.drain()
        refused: Refused | None = None
        while True:
            for event in conn.events():
                if isinstance(event, AcceptConnection):
                    kept = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.extra_headers]
                    kept = [(k, v) for k, v in kept if k.lower() not in HANDSHAKE_HEADERS]
                    return cls(reader, writer, conn, event.subprotocol, kept, stall_seconds)
                if isinstance(event, RejectConnection):
                    kept = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers]
                    refused = Refused(event.status_code, kept, b"")
                    if not event.has_body:
                        writer.close()
                        return refused
                elif isinstance(event, RejectData) and refused is not None:
                    body = (refused.body + bytes(event.data))[:REFUSAL_BODY_BYTES]
                    refused = Refused(refused.status, refused.headers, body)
                    if event.body_finished:
                        writer.close()
                        return refused
            data = await reader.read(_CHUNK)
            if not data:
                if refused is not None:  # a body delimited by the connection's end
                    writer.close()
                    return refused
                raise UpstreamError("the connection closed during the WebSocket handshake")
            conn.receive_data(data)

    async def _write(self, data: bytes) -> None:
        self.writer.write(data)
        await asyncio.wait_for(self.writer.drain(), self.stall_seconds)

    async def send(self, data: str | bytes) -> None:
        await self._write(self.conn.send(TextMessage(data) if isinstance(data, str) else BytesMessage(data)))

    async def receive(self) -> str | bytes | Closed:
        """The next whole message, or the close (a message over MAX_MESSAGE_BYTES closes with 1009)."""
        text: list[str] = []
        binary = bytearray()
        size = 0
        pinged = False
        while True:
            for event in self.conn.events():
                if isinstance(event, TextMessage | BytesMessage):
                    if isinstance(event, TextMessage):
                        text.append(event.data)
                        size += len(event.data.encode())
                    else:
                        binary += event.data
                        size = len(binary)
                    if size > MAX_MESSAGE_BYTES:
                        await self.close(1009, f"message over {MAX_MESSAGE_BYTES} bytes")
                        return Closed(1009, f"message over {MAX_MESSAGE_BYTES} bytes")
                    if event.message_finished:
                        return "".join(text) if isinstance(event, TextMessage) else bytes(binary)
                elif isinstance(event, Ping):
                    await self._write(self.conn.send(event.response()))
                elif isinstance(event, CloseConnection):
                    if self.conn.state is ConnectionState.REMOTE_CLOSING:
                        with contextlib.suppress(OSError, TimeoutError):
                            await self._write(self.conn.send(event.response()))
                    self.writer.close()
                    return Closed(event.code, event.reason or "")
            try:
                data = await asyncio.wait_for(self.reader.read(_CHUNK), PING_SECONDS)
            except TimeoutError:
                if pinged:  # no answer to our ping either: the peer (or the way to it) is gone
                    self.writer.close()
                    return Closed(1006, "no answer to a ping")
                pinged = True
                await self._write(self.conn.send(Ping(payload=b"adx")))
                continue
            except OSError:
                data = b""
            pinged = False
            self.conn.receive_data(data or None)  # None: the connection's end, a 1006 close event

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close (once; a connection that failed is left as it is). Only sent: the peer's close comes
        back through ``receive`` (the bridge reads on until then, CLOSE_SECONDS at most), so that one task
        alone ever reads the stream."""
        if self.conn.state is ConnectionState.OPEN:
            with contextlib.suppress(OSError, TimeoutError, LocalProtocolError):
                await self._write(self.conn.send(CloseConnection(sendable(code), reason[:120])))


async def deny(websocket: WebSocket, response: Response) -> None:
    """Refuse an upgrade with an HTTP answer (the ASGI denial extension, which uvicorn's wsproto protocol has)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:
        await websocket.close(1011 if response.status_code >= 500 else 1008)


def refusal_response(refused: Refused, dropped: frozenset[str]) -> Response:
    """The upstream's refusal as the answer to the client's upgrade (hop-by-hop headers dropped)."""
    response = Response(refused.body, status_code=refused.status)
    response.raw_headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1"))
        for k, v in refused.headers
        if k.lower() not in dropped and k.lower() != "content-length"
    ] + [(b"content-length", str(len(refused.body)).encode())]
    return response


async def bridge(websocket: WebSocket, upstream: WebSocketClient, accept_headers: list[tuple[str, str]]) -> None:
    """Accept the client's WebSocket as the upstream accepted ours, then relay both ways until either side
    closes; the other is closed with the same code and reason."""
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in accept_headers]
    await websocket.accept(upstream.subprotocol, headers)
    tasks = {
        asyncio.create_task(_client_to_upstream(websocket, upstream)),
        asyncio.create_task(_upstream_to_client(websocket, upstream)),
    }
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        # One side closed and the other was told: its close (or its end) follows at once from a live peer.
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_SECONDS)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        upstream.writer.close()


async def _client_to_upstream(websocket: WebSocket, upstream: WebSocketClient) -> None:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            await upstream.close(int(message.get("code", 1000)), str(message.get("reason") or ""))
            return
        text = message.get("text")
        try:
            await upstream.send(text if text is not None else bytes(message.get("bytes") or b""))
        except (OSError, TimeoutError, LocalProtocolError):
            await _close_client(websocket, 1011, "the sandbox's side stopped taking data")
            return


async def _upstream_to_client(websocket: WebSocket, upstream: WebSocketClient) -> None:
    while True:
        try:
            received = await upstream.receive()
        except (OSError, TimeoutError, LocalProtocolError, RemoteProtocolError) as exc:
            received = Closed(1006, str(exc))
        if isinstance(received, Closed):
            await _close_client(websocket, received.code, received.reason)
            return
        message = {"type": "websocket.send", "bytes": received} if isinstance(received, bytes) else None
        try:
            await asyncio.wait_for(
                websocket.send(message or {"type": "websocket.send", "text": received}), upstream.stall_seconds
            )
        except TimeoutError:
            await upstream.close(1011, "the client stopped taking data")
            await _close_client(websocket, 1011, "stopped taking data")
            return
        except (OSError, RuntimeError):  # the client is gone (uvicorn's ClientDisconnected is an OSError)
            await upstream.close(1001, "the client went away")
            return


async def _close_client(websocket: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        await websocket.close(sendable(code), reason[:120])
