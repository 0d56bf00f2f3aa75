"""``Range`` requests on envd's ``GET /files``, as envd answers them (Go's ``http.ServeContent``, RFC 9110 14).

One byte range (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) is answered 206 with ``Content-Range``; an end past the
file is cut at its end. A range that starts past the end (or a suffix of 0 bytes), or a header that does not
parse, is 416 with ``Content-Range: bytes */size``. Several ranges are answered with the whole file (200: a
server may ignore ``Range``; envd would send ``multipart/byteranges``). execd has no ranged read, so the slice is
cut from its stream here: the bytes before the range are read and dropped, the stream is closed after it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.responses import JSONResponse, Response, StreamingResponse

from adx.e2b._upstream import chunks, close

__all__ = ["ByteRange", "Unsatisfiable", "parse_range", "ranged"]


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1


class Unsatisfiable(Exception):
    """The header asks for no byte of the file, or does not parse (416)."""


def _int(text: str) -> int:
    text = text.strip()
    if not text.isdigit():  # digits only: no sign, no spaces inside
        raise Unsatisfiable(f"invalid range number {text!r}")
    return int(text)


def parse_range(header: str, size: int) -> ByteRange | None:
    """The one range ``header`` asks of a ``size``-byte file; None: answer the whole file (another unit, or
    several ranges). Raises :class:`Unsatisfiable`."""
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes":
        raise Unsatisfiable(f"only bytes ranges are served, got {unit.strip()!r}")
    parts = [p for p in spec.split(",") if p.strip()]
    if not parts:
        raise Unsatisfiable("no range given")
    if len(parts) > 1:
        return None
    first, dash, last = parts[0].strip().partition("-")
    if not dash:
        raise Unsatisfiable(f"invalid range {parts[0]!r}")
    if not first.strip():  # a suffix: the last n bytes
        count = _int(last)
        if count == 0 or size == 0:
            raise Unsatisfiable("the range asks for no byte")
        return ByteRange(max(0, size - count), size - 1)
    start = _int(first)
    end = _int(last) if last.strip() else None
    if end is not None and end < start:
        raise Unsatisfiable(f"invalid range {parts[0]!r}: its end is before its start")
    if start >= size:
        raise Unsatisfiable(f"the range starts at byte {start}, past the end of the {size}-byte file")
    return ByteRange(start, size - 1 if end is None else min(end, size - 1))


async def _slice(upstream: Response, wanted: ByteRange) -> AsyncIterator[bytes]:
    position = 0
    try:
        async for chunk in chunks(upstream):
            begin, stop = max(wanted.start - position, 0), min(wanted.end + 1 - position, len(chunk))
            position += len(chunk)
            if begin < stop:
                yield chunk[begin:stop]
            if position > wanted.end:
                return
    finally:
        await close(upstream)


async def ranged(upstream: Response, header: str | None) -> Response:
    """execd's whole-file answer ``upstream`` (200, its ``Content-Length`` the size) as the answer to ``header``.

    A file whose size is not known up front (``/proc``: streamed to its end, chunked) is answered whole."""
    size_text = upstream.headers.get("content-length")
    if size_text is None or not size_text.isdigit():
        return upstream
    size = int(size_text)
    upstream.headers["accept-ranges"] = "bytes"
    if header is None:
        return upstream
    try:
        wanted = parse_range(header, size)
    except Unsatisfiable as exc:
        await close(upstream)
        return JSONResponse(
            {"code": 416, "message": f"invalid range: {exc}"},
            status_code=416,
            headers={"content-range": f"bytes */{size}"},
        )
    if wanted is None:
        return upstream
    headers = {
        "content-type": upstream.headers.get("content-type", "application/octet-stream"),
        "content-range": f"bytes {wanted.start}-{wanted.end}/{size}",
        "content-length": str(wanted.length),
        "accept-ranges": "bytes",
    }
    return StreamingResponse(_slice(upstream, wanted), status_code=206, headers=headers)
