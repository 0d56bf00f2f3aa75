"""Typed async client of sandboxd's node-level runtime-control subscription (CTL-1..3).

``RuntimeControlSubscription`` keeps ONE connection to ``Health.runtime_control_socket``; every (re)connect
starts with a full snapshot, then per-sandbox coalesced deltas. When the connection breaks, the client emits
a ``disconnected`` event — every observation is cleared (CTL-3: a broken stream is no information) — and
reconnects with capped exponential backoff; the next event is a fresh ``snapshot``.

```python
async with RuntimeControlSubscription(health.runtime_control_socket) as sub:
    async for event in sub:
        if event.kind == "snapshot": ...          # event.sandboxes: every sandbox with a live execd
        elif event.kind == "delta": ...           # event.sandbox_id, event.state (None: observation cleared)
        elif event.kind == "disconnected": ...    # all observations cleared; a snapshot follows on reconnect
    result = await sub.close_admission("sb-1", expected_version=7)   # IDLE-6: ok False if the version moved
    await sub.ack_checkpoint("sb-1", operation_id)                   # CTL-7
```

Requests need a live connection (else :class:`UnavailableError`); a reply lost with the connection is
:class:`UncertainOutcomeError` (the request may have reached execd).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from adx._fs import ShortUnixPath
from adx.errors import (
    InvalidInputError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
    VersionMismatchError,
)
from adx.execd._protocol import PROTOCOL_VERSION, Message
from adx.sandboxd._errors import PermissionDeniedError
from adx.sandboxd._models import RuntimeObservation

__all__ = ["AdmissionResult", "RuntimeControlEvent", "RuntimeControlSubscription"]

log = logging.getLogger("adx.sandboxd.control")

MAX_LINE = 1 << 20  # = adx.execd._protocol.MAX_LINE


@dataclass(frozen=True)
class RuntimeControlEvent:
    """``snapshot`` (``sandboxes`` holds every observed sandbox), ``delta`` (one sandbox; ``state`` None =
    its execd connection was lost, observation cleared) or ``disconnected`` (the stream broke: all cleared)."""

    kind: Literal["snapshot", "delta", "disconnected"]
    seq: int = 0
    sandboxes: dict[str, RuntimeObservation] = field(default_factory=dict)
    sandbox_id: str | None = None
    state: RuntimeObservation | None = None
    error: str | None = None


@dataclass(frozen=True)
class AdmissionResult:
    ok: bool
    version: int | None
    admission_open: bool | None
    error: str | None = None  # "version_changed" when close_admission's expected version was stale


class RuntimeControlSubscription:
    def __init__(
        self,
        path: Path | str,
        *,
        min_backoff: float = 0.05,
        max_backoff: float = 2.0,
        request_timeout: float = 10.0,
        max_queue: int = 10_000,
    ) -> None:
        self.path = Path(path)
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.request_timeout = request_timeout
        #: The current view: sandbox ID -> last observation (rebuilt from every snapshot).
        self.states: dict[str, RuntimeObservation] = {}
        self.connected = False
        self.connects = 0
        self.last_error: str | None = None
        self._events: asyncio.Queue[RuntimeControlEvent] = asyncio.Queue(max_queue)
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._snapshot_seen = asyncio.Event()
        #: CTL-8: set while sandboxd speaks another runtime-control protocol (the reason); the client keeps
        #: retrying, since sandboxd may be replaced by the matching version.
        self.mismatch: str | None = None
        self._mismatch_seen = asyncio.Event()
        self._tick = asyncio.Event()  # set (and replaced) on every change of ``states``

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def __aenter__(self) -> RuntimeControlSubscription:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="runtime-control-subscription")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.connected = False

    async def wait_connected(self, within: float) -> None:
        """Until the first snapshot of the current connection arrived (UnavailableError after ``within`` seconds;
        VersionMismatchError at once when sandboxd speaks another protocol, CTL-8)."""
        waits = [asyncio.ensure_future(self._snapshot_seen.wait()), asyncio.ensure_future(self._mismatch_seen.wait())]
        try:
            await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        if self._snapshot_seen.is_set():
            return
        if self.mismatch is not None:
            raise VersionMismatchError(self.mismatch)
        raise UnavailableError(
            f"runtime-control subscription {self.path} not connected within {within}s: {self.last_error}"
        )

    # -- events -----------------------------------------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[RuntimeControlEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RuntimeControlEvent]:
        self.start()
        while True:
            yield await self._events.get()

    async def next_event(self, within: float | None = None) -> RuntimeControlEvent:
        self.start()
        return await asyncio.wait_for(self._events.get(), within)

    async def wait_until(self, predicate: Callable[[dict[str, RuntimeObservation]], bool], within: float) -> bool:
        """Wait until ``predicate(states)`` holds (True) or ``within`` seconds passed (False).

        Independent of the event iterator: any number of tasks may wait (e.g. one per Controller).
        """
        self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not predicate(self.states):
            tick, remaining = self._tick, deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tick.wait(), remaining)
        return True

    def _emit(self, event: RuntimeControlEvent) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()
        if self._events.full():
            # A consumer that stopped reading: drop the oldest; ``states`` stays exact either way.
            with contextlib.suppress(asyncio.QueueEmpty):
                self._events.get_nowait()
        self._events.put_nowait(event)

    # -- requests ---------------------------------------------------------------------------------------------
    async def close_admission(self, sandbox_id: str, expected_version: int) -> AdmissionResult:
        """IDLE-6: close execd's client admission iff its activity version is still ``expected_version``."""
        message = {"type": "close_admission", "sandboxId": sandbox_id, "expectedVersion": expected_version}
        return _admission(await self._request(message))

    async def open_admission(self, sandbox_id: str) -> AdmissionResult:
        return _admission(await self._request({"type": "open_admission", "sandboxId": sandbox_id}))

    async def ack_checkpoint(self, sandbox_id: str, operation_id: str) -> None:
        """The node took the workload's checkpoint request over: execd drops it from its pending list."""
        message: Message = {"type": "checkpoint_ack", "sandboxId": sandbox_id, "operationId": operation_id}
        reply = await self._request(message)
        if not reply.get("ok"):
            _raise(reply)

    async def _request(self, message: Message) -> Message:
        writer = self._writer
        if writer is None or not self.connected:
            raise UnavailableError(f"runtime-control subscription {self.path} is not connected")
        request_id = next(self._ids)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            writer.write(json.dumps({**message, "requestId": request_id}).encode() + b"\n")
            try:
                await asyncio.wait_for(writer.drain(), self.request_timeout)
            except (OSError, TimeoutError) as exc:
                raise UnavailableError(f"runtime-control subscription: sending failed ({exc!r})") from exc
            try:
                reply = await asyncio.wait_for(future, self.request_timeout)
            except TimeoutError:
                raise UncertainOutcomeError(f"no reply to {message['type']} within {self.request_timeout}s") from None
        finally:
            self._pending.pop(request_id, None)
        if reply.get("error") in ("not_found", "unavailable"):
            _raise(reply)
        return reply

    # -- connection loop --------------------------------------------------------------------------------------
    async def _run(self) -> None:
        delay = self.min_backoff
        while True:
            try:
                with ShortUnixPath(self.path) as path:
                    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path, limit=MAX_LINE), 5.0)
            except (OSError, TimeoutError) as exc:
                self.last_error = f"connect failed: {exc!r}"
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff)
                continue
            try:
                await self._session(reader, writer)
                self.last_error = "closed by sandboxd"
            except VersionMismatchError as exc:
                self.last_error = str(exc)
                log.error("runtime-control stream refused: %s", exc)
                delay = self.max_backoff  # not a blip: retry slowly until sandboxd is replaced
            except (OSError, asyncio.IncompleteReadError, ValueError, PermissionDeniedError) as exc:
                self.last_error = repr(exc)
            finally:
                writer.close()
                was_connected, self.connected, self._writer = self.connected, False, None
                self._snapshot_seen.clear()
                for future in self._pending.values():
                    if not future.done():
                        future.set_exception(UncertainOutcomeError("the runtime-control stream broke before a reply"))
                self._pending.clear()
                if was_connected:
                    self.states = {}
                    self._emit(RuntimeControlEvent("disconnected", error=self.last_error))
                    delay = self.min_backoff  # it worked until now: retry soon
            log.info("runtime-control stream lost; reconnecting", extra={"reason": self.last_error})
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            message = json.loads(line)
            kind = message.get("type")
            if kind == "snapshot":
                protocol = message.get("protocol")
                if protocol != PROTOCOL_VERSION:
                    self.mismatch = (
                        f"sandboxd at {self.path} speaks runtime-control protocol {protocol!r}, this node speaks "
                        f"{PROTOCOL_VERSION}: upgrade the node, sandboxd and execd together (CTL-8)"
                    )
                    self._mismatch_seen.set()
                    raise VersionMismatchError(self.mismatch)
                self.mismatch = None
                self._mismatch_seen.clear()
                self.states = {sid: RuntimeObservation.model_validate(s) for sid, s in message["sandboxes"].items()}
                self._writer, self.connected = writer, True
                self.connects += 1
                self._snapshot_seen.set()
                self._emit(RuntimeControlEvent("snapshot", seq=message.get("seq", 0), sandboxes=dict(self.states)))
            elif kind == "delta":
                sandbox_id = message["sandboxId"]
                raw = message.get("state")
                state = None if raw is None else RuntimeObservation.model_validate(raw)
                if state is None:
                    self.states.pop(sandbox_id, None)
                else:
                    self.states[sandbox_id] = state
                self._emit(RuntimeControlEvent("delta", seq=message.get("seq", 0), sandbox_id=sandbox_id, state=state))
            elif kind == "reply":
                if message.get("error") == "permission_denied" and not self.connected:
                    raise PermissionDeniedError(f"sandboxd refused the subscription on {self.path}")
                future = self._pending.get(message.get("requestId"))
                if future is not None and not future.done():
                    future.set_result(message)


def _admission(reply: Message) -> AdmissionResult:
    if reply.get("error") == "invalid_input":
        raise InvalidInputError(str(reply.get("field") or "expectedVersion"), "must be an integer")
    version, admission_open, error = reply.get("version"), reply.get("admissionOpen"), reply.get("error")
    return AdmissionResult(
        ok=bool(reply.get("ok")),
        version=version if isinstance(version, int) and not isinstance(version, bool) else None,
        admission_open=admission_open if isinstance(admission_open, bool) else None,
        error=None if error is None else str(error),
    )


def _raise(reply: Message) -> None:
    message = str(reply.get("message") or reply.get("error") or "request failed")
    if reply.get("error") == "not_found":
        raise NotFoundError(message)
    if reply.get("error") == "unavailable":
        raise UnavailableError(message)
    raise UnavailableError(message)
