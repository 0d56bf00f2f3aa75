"""sandboxd's API socket speaks through the shared bounded HTTP server (``adx._httpserver``): a request over a
limit gets sandboxd's error body with the limit's status, and the connection is closed."""

from __future__ import annotations

import asyncio
import json

from sbx_helpers import DaemonFactory

from adx.sandboxd._http import LIMITS


async def _exchange(path: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(20):
            data = await reader.read()  # the server closes after a refusal: read to EOF
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


async def test_requests_over_the_limits_get_sandboxd_error_bodies(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    path = str(d.socket)
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(LIMITS.header_count + 1))
    cases = {
        431: b"POST /v1/List HTTP/1.1\r\nHost: x\r\n" + many + b"Content-Length: 2\r\n\r\n{}",
        413: b"POST /v1/List HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (LIMITS.body_bytes + 1),
        414: b"POST /v1/" + b"L" * LIMITS.request_line_bytes + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        400: b"garbage\r\n\r\n",
    }
    for status, request in cases.items():
        got, headers, body = await _exchange(path, request)
        assert (got, headers["connection"]) == (status, "close"), request[:80]
        err = json.loads(body)["error"]
        assert err["code"] == "invalid_input" and err["details"]["field"] == "request", err
    # and the socket still answers a well-formed call
    got, headers, body = await _exchange(
        path, b"POST /v1/List HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    )
    assert got == 200 and "sandboxes" in json.loads(body), body
