"""The one bounded HTTP/1.1 server (``adx._httpserver``, sandboxd's API and the agent worker's health endpoint):
every limit is met by a real socket peer, and an oversized or endless head is refused, not buffered."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable

import pytest

from adx._httpserver import HttpLimits, HttpRequest, HttpResponse, serve_http

LIMITS = HttpLimits(
    request_line_bytes=256,
    head_bytes=2048,
    header_count=8,
    body_bytes=1000,
    head_seconds=0.5,
    body_seconds=0.5,
    write_seconds=2.0,
    idle_seconds=0.5,
)


class Server:
    def __init__(self) -> None:
        self.requests: list[HttpRequest] = []
        self.port = 0

    async def answer(self, request: HttpRequest) -> HttpResponse:
        self.requests.append(request)
        return HttpResponse(200, json.dumps({"path": request.target, "size": len(request.body)}).encode())

    @staticmethod
    def refusal(status: int, message: str) -> bytes:
        return json.dumps({"error": {"status": status, "message": message}}).encode()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_http(reader, writer, state.answer, state.refusal, LIMITS)

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.port = srv.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        srv.close()
        await srv.wait_closed()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # keep the kernel from hiding a server's reads
    return sock


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:length]


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _send_until_answered(sock: socket.socket, first: bytes, more: Callable[[], bytes]) -> tuple[int, int]:
    """Send ``first``, then ``more()`` forever: the (status, bytes sent) once the server answers."""
    sock.sendall(first)
    sent = len(first)
    sock.setblocking(False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            answer = sock.recv(65536)
        except BlockingIOError:
            answer = b""
        if answer:
            return int(answer.split(b" ", 2)[1]), sent
        try:
            sent += sock.send(more())
        except BlockingIOError:
            time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            break
    raise AssertionError(f"no answer after {sent} bytes")


async def test_requests_on_a_kept_alive_connection(server: Server) -> None:
    def client() -> list[tuple[int, bytes]]:
        with _connect(server.port) as sock:
            out = []
            for body in (b"", b"x" * 1000):
                sock.sendall(b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                status, headers, payload = _read_response(sock)
                assert headers["connection"] == "keep-alive"
                out.append((status, payload))
            sock.sendall(b"GET /b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            status, headers, payload = _read_response(sock)
            assert headers["connection"] == "close" and _closed(sock)
            return [*out, (status, payload)]

    answers = await asyncio.to_thread(client)
    assert [json.loads(p) for _, p in answers] == [
        {"path": "/a", "size": 0},
        {"path": "/a", "size": 1000},
        {"path": "/b", "size": 0},
    ]
    assert [s for s, _ in answers] == [200, 200, 200]


async def test_chunked_body_within_the_limit(server: Server) -> None:
    def client() -> tuple[int, bytes]:
        with _connect(server.port) as sock:
            sock.sendall(b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            status, _, payload = _read_response(sock)
            return status, payload

    status, payload = await asyncio.to_thread(client)
    assert status == 200 and json.loads(payload)["size"] == 5 and server.requests[-1].body == b"hello"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414),  # request line over 256 bytes
        (b"GET / HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(9)) + b"\r\n", 431),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"v" * 3000 + b"\r\n\r\n", 431),  # head over 2048 bytes
        (b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n", 413),  # refused before the body
        (b"NOT A REQUEST\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
    ],
)
async def test_a_request_over_a_limit_is_refused_and_the_connection_closed(
    server: Server, request_bytes: bytes, status: int
) -> None:
    def client() -> tuple[int, bytes, bool]:
        with _connect(server.port) as sock:
            sock.sendall(request_bytes)
            got, headers, payload = _read_response(sock)
            assert headers["connection"] == "close"
            return got, payload, _closed(sock)

    got, payload, closed = await asyncio.to_thread(client)
    assert (got, closed) == (status, True)
    assert json.loads(payload)["error"]["status"] == status
    assert server.requests == [], "no refused request reaches the handler"


async def test_a_chunked_body_over_the_limit_is_refused_as_it_passes_it(server: Server) -> None:
    def client() -> tuple[int, int]:
        with _connect(server.port) as sock:
            head = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            return _send_until_answered(sock, head, lambda: b"100\r\n" + b"z" * 256 + b"\r\n")

    status, _sent = await asyncio.to_thread(client)
    assert status == 413 and server.requests == []


@pytest.mark.parametrize(
    ("first", "more", "status"),
    [
        (b"GET /", lambda: b"a" * 512, 414),  # a request line that never ends
        (b"GET / HTTP/1.1\r\nHost: t\r\nX-Endless: ", lambda: b"v" * 512, 431),  # a header that never ends
        (b"GET / HTTP/1.1\r\nHost: t\r\n", lambda: b"X-Many: 1\r\n", 431),  # headers that never end
    ],
)
async def test_an_endless_head_is_refused_not_buffered(
    server: Server, first: bytes, more: Callable[[], bytes], status: int
) -> None:
    def client() -> tuple[int, int]:
        with _connect(server.port) as sock:
            return _send_until_answered(sock, first, more)

    got, sent = await asyncio.to_thread(client)
    assert got == status
    # The server answered while the peer was still sending: it stopped reading at its cap (plus one read).
    assert sent < LIMITS.head_bytes + (1 << 16) + (1 << 20), sent


async def test_a_trickled_head_or_a_stalled_body_times_out(server: Server) -> None:
    def trickle() -> tuple[int, float]:
        with _connect(server.port) as sock:
            start = time.monotonic()
            sock.sendall(b"GET / HTTP/1.1\r\n")
            sock.settimeout(0.1)
            status = 0
            for i in range(100):  # one small header every 0.1 s: each under every size cap
                try:
                    sock.sendall(b"X-%d: 1\r\n" % i)
                except (BrokenPipeError, ConnectionResetError):
                    break
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                status = int(data.split(b" ", 2)[1]) if data else -1
                break
            return status, time.monotonic() - start

    def stall() -> int:
        with _connect(server.port) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nab")
            return _read_response(sock)[0]

    (status, took), stalled = await asyncio.gather(asyncio.to_thread(trickle), asyncio.to_thread(stall))
    assert status == 408 and took < 5, (status, took)
    assert stalled == 408 and server.requests == []


async def test_a_slow_head_under_every_size_cap_gets_408(server: Server) -> None:
    def client() -> int:
        with _connect(server.port) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n")  # and never the blank line
            return _read_response(sock)[0]

    assert await asyncio.to_thread(client) == 408


async def test_an_idle_kept_alive_connection_is_closed(server: Server) -> None:
    def client() -> tuple[int, bool, float]:
        with _connect(server.port) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            status, _, _ = _read_response(sock)
            start = time.monotonic()
            return status, _closed(sock), time.monotonic() - start

    status, closed, idle = await asyncio.to_thread(client)
    assert status == 200 and closed and LIMITS.idle_seconds * 0.5 < idle < 5
