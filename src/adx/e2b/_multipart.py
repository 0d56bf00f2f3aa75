"""A streaming ``multipart/form-data`` reader: parts one after another, each body streamed in chunks.

Memory stays bounded by one network chunk plus the boundary whatever the part sizes: a part's body is yielded
as it arrives, holding back only what could be the start of the next boundary.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from adx.errors import InvalidInputError

MAX_HEAD = 16 * 1024
_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')


def boundary_of(content_type: str) -> bytes:
    for name, value in _PARAM.findall(";" + content_type.partition(";")[2]):
        if name.lower() == "boundary":
            return str(value).strip().strip('"').encode()
    raise InvalidInputError("Content-Type", "multipart/form-data without a boundary")


def disposition(headers: dict[str, str]) -> dict[str, str]:
    """The parameters of a part's Content-Disposition (``name``, ``filename``), unquoted."""
    params: dict[str, str] = {}
    for name, value in _PARAM.findall(";" + headers.get("content-disposition", "").partition(";")[2]):
        value = value.strip()
        if value.startswith('"') and value.endswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1]).replace("%22", '"')
        params[name.lower()] = value
    return params


class MultipartReader:
    def __init__(self, stream: AsyncIterator[bytes], boundary: bytes) -> None:
        self._stream = stream
        # The first boundary may follow a preamble or start the body: a leading CRLF makes both one case.
        self._buffer = bytearray(b"\r\n")
        self._delimiter = b"\r\n--" + boundary
        self._done = False

    async def _fill(self) -> None:
        try:
            chunk = await anext(self._stream)
        except StopAsyncIteration:
            raise InvalidInputError("body", "the multipart body ended early") from None
        self._buffer += chunk

    async def _skip_to_delimiter(self) -> None:
        while (index := self._buffer.find(self._delimiter)) < 0:
            del self._buffer[: max(0, len(self._buffer) - len(self._delimiter))]
            await self._fill()
        del self._buffer[: index + len(self._delimiter)]

    async def _after_delimiter(self) -> bool:
        """True if a part follows, False at the closing delimiter."""
        while len(self._buffer) < 2:
            await self._fill()
        if self._buffer[:2] == b"--":
            self._done = True
            return False
        while (end := self._buffer.find(b"\r\n")) < 0:  # transport padding, then CRLF
            await self._fill()
        del self._buffer[: end + 2]
        return True

    async def _headers(self) -> dict[str, str]:
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            if len(self._buffer) > MAX_HEAD:
                raise InvalidInputError("body", "a multipart part's headers are too large")
            if self._buffer.startswith(b"\r\n"):  # a part without headers
                del self._buffer[:2]
                return {}
            await self._fill()
        raw = bytes(self._buffer[:end]).decode("utf-8", "replace")
        del self._buffer[: end + 4]
        headers: dict[str, str] = {}
        for line in raw.split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return headers

    async def body(self) -> AsyncIterator[bytes]:
        """The current part's body, up to the next delimiter (which is consumed)."""
        keep = len(self._delimiter)
        while True:
            index = self._buffer.find(self._delimiter)
            if index >= 0:
                if index:
                    yield bytes(self._buffer[:index])
                del self._buffer[: index + keep]
                return
            if len(self._buffer) > keep:
                cut = len(self._buffer) - keep
                yield bytes(self._buffer[:cut])
                del self._buffer[:cut]
            await self._fill()

    async def parts(self) -> AsyncIterator[dict[str, str]]:
        """Each part's headers; read the part with :meth:`body` before asking for the next one."""
        await self._skip_to_delimiter()
        while await self._after_delimiter():
            yield await self._headers()
