"""The answer a proxy hop (the Ingress, the Relay) gives for what its upstream answered, as plain ASGI.

Why not Starlette's ``StreamingResponse``: under uvicorn's ASGI 2.3 scope it runs every answer in an anyio task
group of two tasks (the body, and a listener for the client's disconnect), even an answer whose body is already
here. On the command path that machinery and its per-message wrappers were a quarter of each proxy's busy time
(docs/performance.md, "Command path"). This class keeps ``StreamingResponse``'s interface (``body_iterator``,
``background``, ``raw_headers``, ``set_cookie``), so callers that read an answer in process still work, and
answers in one of two ways:

- ``whole``: the upstream body is complete already (a short answer with a Content-Length): the head and one body
  message, no task; there is nothing left to cancel if the client goes away.
- streamed: chunk by chunk as the upstream produces them (NDJSON frames of a running command); one watcher task
  waits for the client's ``http.disconnect`` and cancels the streaming, whose iterator then closes the upstream
  connection (which stops a foreground command).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

#: An upstream answer with a Content-Length up to this is read whole and sent in one message.
SHORT_ANSWER_BYTES = 64 * 1024


def forwarded_headers(headers: list[tuple[str, str]], drop: frozenset[str]) -> list[tuple[bytes, bytes]]:
    """An upstream's headers as an ASGI answer carries them: as they came (repeated ones, a user service's
    Set-Cookie, kept), names lower-cased, the hop's own (``drop``, lower-case) left out."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers if k.lower() not in drop]


def is_short(headers: list[tuple[str, str]]) -> bool:
    """Whether an upstream answer's declared Content-Length (if any) is short enough to be read whole."""
    declared = next((v for k, v in headers if k.lower() == "content-length"), None)
    return declared is not None and declared.isdigit() and int(declared) <= SHORT_ANSWER_BYTES


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


class ProxiedAnswer(StreamingResponse):
    def __init__(
        self,
        status_code: int,
        raw_headers: list[tuple[bytes, bytes]],
        *,
        chunks: AsyncIterator[bytes] | None = None,
        whole: bytes | None = None,
        background: BackgroundTask | None = None,
    ) -> None:
        if (chunks is None) == (whole is None):
            raise ValueError("ProxiedAnswer needs exactly one of chunks (streamed) and whole (complete)")
        self.chunks = chunks if chunks is not None else _once(whole or b"")
        super().__init__(self.chunks, status_code, background=background)
        self.whole = whole
        # The upstream's headers as they came (repeated ones kept); the proxy dropped its hop-by-hop ones.
        self.raw_headers = raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if self.whole is not None:
            await send({"type": "http.response.body", "body": self.whole})
        else:
            await self._stream(receive, send)
        if self.background is not None:
            await self.background()

    async def _stream(self, receive: Receive, send: Send) -> None:
        me = asyncio.current_task()
        assert me is not None  # an ASGI app always runs in a task
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass  # the request's body was read before the answer began: nothing else is expected
            gone = True
            me.cancel()  # interrupts the wait for the upstream's next chunk (or a blocked send)

        watcher = asyncio.create_task(watch())
        try:
            async for chunk in self.chunks:
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            # Our own cancellation, for a client that went away, ends the answer here; any other is passed on.
            if not gone or me.uncancel() > 0:
                raise
        finally:
            watcher.cancel()
