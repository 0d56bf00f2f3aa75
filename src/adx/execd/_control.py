"""execd's side of runtime control (CTL-1): report to sandboxd over the per-sandbox control socket.

On every (re)connect execd sends ``hello`` with its full state, then events as they happen. Activity changes
are coalesced: at most one ``activity`` message per ``coalesce`` seconds, always carrying the newest values,
so a burst of requests costs sandboxd one message. Events raised while disconnected are not queued: the next
``hello`` carries the state they produced. When the socket goes away execd reconnects with capped backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

from adx._backoff import Backoff
from adx.execd import _protocol as P
from adx.execd._activity import Activity

__all__ = ["ControlClient"]

log = logging.getLogger("adx.execd.control")

RECONNECT_MIN = 0.05
RECONNECT_MAX = 1.0
#: A write that cannot complete in this long means sandboxd stopped reading: drop and reconnect.
WRITE_TIMEOUT = 10.0


class ControlClient:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sandbox_id: str,
        execution_id: str | None,
        activity: Activity,
        coalesce: float = 0.05,
    ) -> None:
        self.path = os.fspath(path)
        self.sandbox_id = sandbox_id
        self.execution_id = execution_id
        self.activity = activity
        self.coalesce = coalesce
        #: execd's own view of what sandboxd should know, folded with the same function sandboxd uses.
        self.state = P.initial_state()
        self.connected = False
        self.connects = 0
        self._queue: list[bytes] = []
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()  # set while everything produced so far has been written
        self._activity_dirty = False
        self._last_activity_sent = 0.0
        self._task: asyncio.Task[None] | None = None
        #: sandboxd -> execd requests other than admission (none today) are ignored; tests may hook here.
        self.on_message: Callable[[P.Message], None] | None = None
        activity.subscribe(self._on_activity)

    # -- events from execd ------------------------------------------------------------------------------
    def emit(self, message: P.Message) -> None:
        """Record an event in the local state and send it if connected."""
        P.apply_event(self.state, message)
        if self.connected:
            self._queue.append(P.encode(message))
            self._flushed.clear()
            self._wake.set()

    def _on_activity(self) -> None:
        self.state["activity"] = self.activity.snapshot()
        if self.connected:
            self._activity_dirty = True
            self._flushed.clear()
            self._wake.set()

    # -- connection loop --------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="execd-control")

    async def drain(self, seconds: float) -> None:
        """Give queued reports (e.g. ``workload_exited`` at shutdown) up to ``seconds`` to reach sandboxd."""
        if self.connected:
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flushed.wait(), seconds)

    async def stop(self) -> None:
        if self._task is not None:
            # Python 3.11's wait_for drops a cancel that lands in the step its inner await finishes (gh-86296):
            # _run then reads e.g. a refused connect and retries forever. Cancel again until it is done.
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=0.1)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        reconnect = Backoff(RECONNECT_MIN, RECONNECT_MAX)
        while True:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(self.path, limit=P.MAX_LINE), 5.0)
            except (OSError, TimeoutError):
                await reconnect.sleep()
                continue
            reconnect.reset()
            try:
                await self._session(reader, writer)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, P.ProtocolError) as exc:
                log.info("control connection lost", extra={"reason": repr(exc)})
            finally:
                self.connected = False
                self._queue.clear()
                self._activity_dirty = False
                writer.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.wait_closed(), 1.0)
            await asyncio.sleep(RECONNECT_MIN)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # hello and "connected" are set in one synchronous step: every later event is queued after it.
        self.state["activity"] = self.activity.snapshot()
        hello = {
            "type": P.HELLO,
            "protocol": P.PROTOCOL_VERSION,
            "sandboxId": self.sandbox_id,
            "executionId": self.execution_id,
            "pid": os.getpid(),
            "state": self.state,
        }
        self._queue = [P.encode(hello)]
        self._activity_dirty = False
        self._last_activity_sent = time.monotonic()
        self.connected = True
        self.connects += 1
        self._wake.set()
        read_task = asyncio.get_running_loop().create_task(self._read(reader, writer))
        try:
            while not read_task.done():
                await self._flush(writer)
                if not self._queue and not self._activity_dirty:
                    self._flushed.set()
                timeout = None
                if self._activity_dirty:
                    timeout = max(0.0, self._last_activity_sent + self.coalesce - time.monotonic())
                wake = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({wake, read_task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                self._wake.clear()
            read_task.result()  # re-raise why the reader stopped
        finally:
            read_task.cancel()
            # asyncio.wait never raises the reader's outcome, and a cancel of *this* task still propagates
            # (suppressing BaseException around ``await read_task`` swallowed it: stop() could hang forever).
            await asyncio.wait({read_task})
            if not read_task.cancelled():
                read_task.exception()  # retrieved: no "exception was never retrieved" noise

    async def _flush(self, writer: asyncio.StreamWriter) -> None:
        now = time.monotonic()
        if self._activity_dirty and now - self._last_activity_sent >= self.coalesce:
            self._activity_dirty = False
            self._last_activity_sent = now
            self._queue.append(P.encode({"type": P.ACTIVITY, **self.activity.snapshot()}))
        if self._queue:
            writer.write(b"".join(self._queue))
            self._queue.clear()
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            line = await reader.readline()
            if not line:
                raise ConnectionResetError("control socket closed by sandboxd")
            message = P.decode(line)
            reply = self._handle(message)
            if reply is not None:
                self._queue.append(P.encode(reply))
                self._wake.set()

    def _handle(self, message: P.Message) -> P.Reply | None:
        kind = message["type"]
        request_id = message.get("requestId")
        if kind == P.CLOSE_ADMISSION:
            expected = message.get("expectedVersion")
            if not isinstance(expected, int) or isinstance(expected, bool):
                return {
                    "type": P.REPLY,
                    "requestId": request_id,
                    "ok": False,
                    "error": "invalid_input",
                    "field": "expectedVersion",
                    "version": self.activity.version,
                }
            ok = self.activity.close_admission(expected)
            return {
                "type": P.REPLY,
                "requestId": request_id,
                "ok": ok,
                "version": self.activity.version,
                "admissionOpen": self.activity.admission_open,
                "error": None if ok else "version_changed",
            }
        if kind == P.OPEN_ADMISSION:
            self.activity.open_admission()
            return {
                "type": P.REPLY,
                "requestId": request_id,
                "ok": True,
                "version": self.activity.version,
                "admissionOpen": True,
                "error": None,
            }
        if kind == P.CHECKPOINT_ACK:
            P.apply_event(self.state, message)
            return None
        if self.on_message is not None:
            self.on_message(message)
        return None
