"""``Range`` requests on envd's ``GET /files``, as envd answers them (Go's ``http.ServeContent``, RFC 9110 14).

One byte range (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) is answered 206 with ``Content-Range``; an end past the
file is cut at its end. A range that starts past the end (or a suffix of 0 bytes), or a header that does not
parse, is 416 with ``Content-Range: bytes */size``. Several ranges: those starting past the end are dropped (416
when none is left), one left is answered as above; more are 206 ``multipart/byteranges`` (each part with its
``Content-Range`` and the file's ``Content-Type``, in the order asked), unless they add up to more than the file,
which is then sent whole (200), as Go does.

execd has no ranged read, so the slices are cut from its stream here: the bytes before a range are read and
dropped, the stream is closed after the last one; a range before the stream's position (ranges asked out of
order or overlapping) opens the file again (``reopen``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from starlette.responses import JSONResponse, Response, StreamingResponse

from adx.e2b._upstream import chunks, close

__all__ = ["ByteRange", "Unsatisfiable", "parse_range", "parse_ranges", "ranged"]

#: Opens the file's execd stream again (from its first byte).
Reopen = Callable[[], Awaitable[Response]]


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.end}/{size}"


class Unsatisfiable(Exception):
    """The header asks for no byte of the file, or does not parse (416)."""


class _PastTheEnd(Unsatisfiable):
    """One range starts past the end: dropped when others are left."""


def _int(text: str) -> int:
    text = text.strip()
    if not text.isdigit():  # digits only: no sign, no spaces inside
        raise Unsatisfiable(f"invalid range number {text!r}")
    return int(text)


def _one(part: str, size: int) -> ByteRange:
    first, dash, last = part.strip().partition("-")
    if not dash:
        raise Unsatisfiable(f"invalid range {part!r}")
    if not first.strip():  # a suffix: the last n bytes
        count = _int(last)
        if count == 0 or size == 0:
            raise _PastTheEnd("the range asks for no byte")
        return ByteRange(max(0, size - count), size - 1)
    start = _int(first)
    end = _int(last) if last.strip() else None
    if end is not None and end < start:
        raise Unsatisfiable(f"invalid range {part!r}: its end is before its start")
    if start >= size:
        raise _PastTheEnd(f"the range starts at byte {start}, past the end of the {size}-byte file")
    return ByteRange(start, size - 1 if end is None else min(end, size - 1))


def parse_ranges(header: str, size: int) -> list[ByteRange]:
    """The ranges ``header`` asks of a ``size``-byte file, in its order, those starting past the end dropped.
    Raises :class:`Unsatisfiable` (a part does not parse, or none is left)."""
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes":
        raise Unsatisfiable(f"only bytes ranges are served, got {unit.strip()!r}")
    parts = [p for p in spec.split(",") if p.strip()]
    if not parts:
        raise Unsatisfiable("no range given")
    ranges: list[ByteRange] = []
    past: _PastTheEnd | None = None
    for part in parts:
        try:
            ranges.append(_one(part, size))
        except _PastTheEnd as exc:
            past = exc
    if not ranges:
        raise past or Unsatisfiable("no range given")
    return ranges


def parse_range(header: str, size: int) -> ByteRange | None:
    """The one range ``header`` asks; None: several (see :func:`parse_ranges`)."""
    ranges = parse_ranges(header, size)
    return ranges[0] if len(ranges) == 1 else None


class _Cursor:
    """execd's stream of the file, read forward once; opened again for a range before what is left of it."""

    def __init__(self, upstream: Response, reopen: Reopen | None) -> None:
        self.reopen = reopen
        self._use(upstream)

    def _use(self, upstream: Response) -> None:
        self.upstream: Response | None = upstream
        self.stream = aiter(chunks(upstream))
        self.offset = 0  # the file offset of ``pending``'s first byte
        self.pending = b""  # read from the stream, not yet passed (the bytes after the last range)

    async def read(self, wanted: ByteRange) -> AsyncIterator[bytes]:
        if self.upstream is None or wanted.start < self.offset:
            await self.close()
            if self.reopen is None:
                raise RuntimeError("a range before the stream's position, and the file cannot be opened again")
            self._use(await self.reopen())
        stop_at = wanted.end + 1
        while self.offset < stop_at:
            if not self.pending:
                try:
                    self.pending = await anext(self.stream)
                except StopAsyncIteration:
                    return  # the file shrank meanwhile: the short body tells the client
            chunk, at = self.pending, self.offset
            begin, stop = max(wanted.start - at, 0), min(stop_at - at, len(chunk))
            if begin < stop:
                yield chunk[begin:stop]
            used = min(len(chunk), stop_at - at)
            self.pending, self.offset = chunk[used:], at + used

    async def close(self) -> None:
        if self.upstream is not None:
            await close(self.upstream)
            self.upstream = None


async def _single(cursor: _Cursor, wanted: ByteRange) -> AsyncIterator[bytes]:
    try:
        async for piece in cursor.read(wanted):
            yield piece
    finally:
        await cursor.close()


def _part_heads(ranges: list[ByteRange], size: int, content_type: str, boundary: str) -> list[bytes]:
    """Each part's head as Go's ``mime/multipart`` writes it (headers sorted by name), and the closing line."""
    heads = []
    for index, wanted in enumerate(ranges):
        lead = "" if index == 0 else "\r\n"
        heads.append(
            f"{lead}--{boundary}\r\nContent-Range: {wanted.content_range(size)}\r\n"
            f"Content-Type: {content_type}\r\n\r\n".encode()
        )
    heads.append(f"\r\n--{boundary}--\r\n".encode())
    return heads


async def _multipart(cursor: _Cursor, ranges: list[ByteRange], heads: list[bytes]) -> AsyncIterator[bytes]:
    try:
        for head, wanted in zip(heads, ranges, strict=False):
            yield head
            async for piece in cursor.read(wanted):
                yield piece
        yield heads[-1]
    finally:
        await cursor.close()


async def ranged(upstream: Response, header: str | None, reopen: Reopen | None = None) -> Response:
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
        ranges = parse_ranges(header, size)
    except Unsatisfiable as exc:
        await close(upstream)
        return JSONResponse(
            {"code": 416, "message": f"invalid range: {exc}"},
            status_code=416,
            headers={"content-range": f"bytes */{size}"},
        )
    if sum(r.length for r in ranges) > size:
        return upstream  # asking more than the file (overlaps): Go sends it whole
    content_type = upstream.headers.get("content-type", "application/octet-stream")
    passed = {k: v for k, v in upstream.headers.items() if k in ("last-modified", "vary")}
    cursor = _Cursor(upstream, reopen)
    if len(ranges) == 1:
        (wanted,) = ranges
        headers = {
            **passed,
            "content-type": content_type,
            "content-range": wanted.content_range(size),
            "content-length": str(wanted.length),
            "accept-ranges": "bytes",
        }
        return StreamingResponse(_single(cursor, wanted), status_code=206, headers=headers)
    boundary = os.urandom(30).hex()  # as Go's multipart writer: 30 random bytes
    heads = _part_heads(ranges, size, content_type, boundary)
    length = sum(len(h) for h in heads) + sum(r.length for r in ranges)
    headers = {
        **passed,
        "content-type": f"multipart/byteranges; boundary={boundary}",
        "content-length": str(length),
        "accept-ranges": "bytes",
    }
    return StreamingResponse(_multipart(cursor, ranges, heads), status_code=206, headers=headers)
