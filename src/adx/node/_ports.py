"""Reaching a user's service inside a sandbox: connect from within the sandbox's network namespace.

``setns`` moves only the calling thread, so connections are made on one dedicated thread that enters the
namespace, connects to ``127.0.0.1:<port>`` and returns to the node's own namespace; the connected socket
stays in the sandbox's namespace. HTTP is then spoken over that socket with h11 (streamed both ways).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import errno
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import h11

from adx.errors import UnavailableError

log = logging.getLogger("adx.node.ports")

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class NamespaceConnector:
    """Opens TCP connections to ports inside network namespaces, on one dedicated thread."""

    def __init__(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="netns")

    def _connect(self, netns: Path, port: int, timeout: float) -> socket.socket:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=timeout)
            finally:
                try:
                    _setns(home)
                except OSError:
                    # This thread is stuck in a sandbox's namespace: never use it again.
                    log.critical("could not return to the node's network namespace; replacing the thread")
                    self._executor.shutdown(wait=False)
                    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="netns")
                    raise
        finally:
            os.close(home)

    async def connect(self, netns: Path, port: int, within_seconds: float = 5.0) -> socket.socket:
        loop = asyncio.get_running_loop()
        try:
            sock = await loop.run_in_executor(self._executor, self._connect, netns, port, within_seconds)
        except ConnectionRefusedError:
            raise UnavailableError(f"nothing listens on port {port} inside the sandbox") from None
        except (TimeoutError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOENT:
                raise UnavailableError("the sandbox's network namespace is gone") from None
            raise UnavailableError(f"cannot reach port {port} inside the sandbox: {exc}") from None
        sock.setblocking(False)
        return sock

    def close(self) -> None:
        self._executor.shutdown(wait=False)


class PortResponse:
    """An HTTP response read from a user's service: status, headers, then the body as a stream."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: AsyncIterator[bytes]) -> None:
        self.status = status
        self.headers = headers
        self.body = body


async def http_over_socket(
    sock: socket.socket,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: AsyncIterator[bytes],
    *,
    host: str,
) -> PortResponse:
    """One HTTP/1.1 exchange on ``sock`` (closed when the body has been read or on error)."""
    reader, writer = await asyncio.open_connection(sock=sock)
    conn = h11.Connection(h11.CLIENT)
    try:
        # A declared length is kept: many services (Python's http.server, simple handlers) read a body only by
        # its Content-Length and see an empty one when it comes chunked. A body of unknown length goes chunked.
        declared = next((v for k, v in headers if k.lower() == "content-length"), None)
        framing = ("content-length", declared) if declared is not None else ("transfer-encoding", "chunked")
        request_headers = [(k, v) for k, v in headers if k.lower() not in ("host", "content-length")]
        request_headers = [("host", host), framing, *request_headers]
        writer.write(conn.send(h11.Request(method=method, target=target, headers=request_headers)))
        async for chunk in body:
            if chunk:
                writer.write(conn.send(h11.Data(data=chunk)))
                await writer.drain()
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        while True:
            event = await _next_event(conn, reader)
            if isinstance(event, h11.Response):
                break
            if isinstance(event, h11.ConnectionClosed):
                raise UnavailableError("the service closed the connection without answering")
    except BaseException:
        writer.close()
        raise

    async def stream() -> AsyncIterator[bytes]:
        try:
            while True:
                next_event = await _next_event(conn, reader)
                if isinstance(next_event, h11.Data):
                    yield bytes(next_event.data)
                elif isinstance(next_event, h11.EndOfMessage | h11.ConnectionClosed):
                    return
        finally:
            writer.close()

    response_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers]
    return PortResponse(event.status_code, response_headers, stream())


async def _next_event(
    conn: h11.Connection, reader: asyncio.StreamReader
) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
    """The next event of ``conn``, reading from ``reader`` as long as h11 needs more data (so never NEED_DATA;
    the type is h11's own, which mypy does not narrow on ``is``)."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(65536))
