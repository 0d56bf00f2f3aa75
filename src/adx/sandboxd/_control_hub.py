"""Node-level runtime-control aggregation (CTL-2, CTL-3), mounted by sandboxd.

- One listening Unix socket per sandbox (:meth:`ControlHub.add_sandbox`); that sandbox's execd connects to it
  and reports with the :mod:`adx.execd._protocol` format. The newest execd connection of a sandbox wins.
- One node-level subscription socket. A subscriber first receives ``snapshot`` (every sandbox with a live
  execd connection and its full state), then ``delta`` messages, one per changed sandbox, coalesced: many
  changes of one sandbox between two flushes cost one delta carrying the newest state. A lost execd
  connection produces ``delta`` with ``"state": null`` (observation cleared). Every (re)subscribe starts
  with a fresh snapshot.
- Subscribers (and sandboxd itself, through the methods) can send ``close_admission`` / ``open_admission`` /
  ``checkpoint_ack`` for a sandbox; the hub forwards them to its execd and relays the reply.

Sockets are bound with their final mode (``fchmod`` before ``bind``: no window with a wider mode and no
``chmod`` by path that a symlink could redirect) and through an ``O_PATH`` descriptor of their directory, so
paths longer than ``sun_path`` work. Subscribers may be restricted to one peer UID (``SO_PEERCRED``).

Standard library only; asyncio; every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adx.errors import NotFoundError, UnavailableError
from adx.execd import _protocol as P
from adx.sandboxd import _unix_sockets as usock

__all__ = ["ControlHub"]

log = logging.getLogger("adx.sandboxd.control_hub")

#: A subscriber or execd that does not accept our bytes within this long is disconnected.
WRITE_TIMEOUT = 10.0


def _unlink(path: Path) -> None:
    # A stale socket file from an earlier run; a local unlink takes microseconds, no thread needed.
    # unlink never follows a symlink: at worst it removes a link someone planted, never its target.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def bind_unix(path: Path, mode: int = 0o600) -> socket.socket:
    """A bound (not yet listening) Unix stream socket at ``path`` with ``mode``, replacing a stale file.

    The directory must be a real directory (not a symlink) that only the host can write to. The mode is set
    on the socket before ``bind`` (Linux applies it to the new file), so nothing is ever changed by path.
    """
    st = os.lstat(path.parent)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path.parent} is not a directory (a symlink?): refusing to bind there")
    return usock.bind_unix(str(path), mode)


def peer_uid(sock: Any) -> int:
    """The connected peer's UID (``SO_PEERCRED``); ``sock``: a socket or asyncio's TransportSocket."""
    return usock.peer_credentials(sock)[1]


def peer_pid(sock: Any) -> int:
    """The connected peer's PID in our PID namespace (``SO_PEERCRED``, recorded at connect)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", raw)[0])


class _Sandbox:
    def __init__(self, sandbox_id: str, path: Path) -> None:
        self.id = sandbox_id
        self.path = path
        self.server: asyncio.AbstractServer | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.state: P.SandboxState | None = None  # None: no live execd connection (no fresh information)
        self.hello: P.Message = {}
        self.pending: dict[int, asyncio.Future[P.Message]] = {}
        self.connections = 0


class _Subscriber:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.dirty: dict[str, None] = {}  # insertion-ordered set of sandbox IDs with unsent changes
        self.wake = asyncio.Event()
        self.seq = 0
        self.last_flush = 0.0  # loop time of the last delta flush
        self.cleared: set[str] = set()  # sandboxes whose observation was cleared since the last flush
        self.urgent = asyncio.Event()  # a pending change a node waits for (Ready, a refusal): no window for it


class ControlHub:
    def __init__(
        self,
        subscribe_path: Path,
        *,
        coalesce: float = 0.02,
        request_timeout: float = 5.0,
        allowed_uid: int | None = None,
        verify_execd: Callable[[str, int], bool] | None = None,
        on_ready: Callable[[str], None] | None = None,
    ) -> None:
        self.subscribe_path = subscribe_path
        #: ``verify_execd(sandbox_id, peer_pid)``: may this process report for the sandbox? (e.g. only its
        #: PID 1, so a workload inside cannot impersonate execd nor kick its connection off). None: anyone.
        self.verify_execd = verify_execd
        #: ``on_ready(sandbox_id)``: its execd reported Ready (on this connection; again after a reconnect). Called
        #: on the loop, before subscribers hear it: sandboxd ends the start-up boost there (``_cgroups.CpuPhase``).
        self.on_ready = on_ready
        self.allowed_uid = allowed_uid  # None: any peer that can reach the socket (its dir is the gate)
        self.coalesce = coalesce
        self.request_timeout = request_timeout
        self._sandboxes: dict[str, _Sandbox] = {}
        self._subscribers: set[_Subscriber] = set()
        self._server: asyncio.AbstractServer | None = None
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        sock = bind_unix(self.subscribe_path)
        self._server = await asyncio.start_unix_server(self._serve_subscriber, sock=sock, limit=P.MAX_LINE)

    async def stop(self) -> None:
        for sandbox_id in list(self._sandboxes):
            await self.remove_sandbox(sandbox_id)
        if self._server is not None:
            self._server.close()
        for sub in list(self._subscribers):
            sub.writer.close()
        for task in list(self._tasks):
            task.cancel()
        _unlink(self.subscribe_path)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def add_sandbox(self, sandbox_id: str, control_path: Path) -> None:
        """Listen on ``control_path`` for ``sandbox_id``'s execd (mode 0600; a stale socket is replaced)."""
        if sandbox_id in self._sandboxes:
            raise ValueError(f"sandbox {sandbox_id!r} is already registered")
        sandbox = _Sandbox(sandbox_id, control_path)
        sock = bind_unix(control_path)
        sandbox.server = await asyncio.start_unix_server(
            lambda r, w: self._serve_execd(sandbox, r, w), sock=sock, limit=P.MAX_LINE
        )
        self._sandboxes[sandbox_id] = sandbox

    def registered(self, sandbox_id: str) -> bool:
        return sandbox_id in self._sandboxes

    async def remove_sandbox(self, sandbox_id: str) -> None:
        self.drop_sandbox(sandbox_id)

    def drop_sandbox(self, sandbox_id: str) -> None:
        """Stop listening for ``sandbox_id``; a subscriber sees its observation cleared (synchronous)."""
        sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return
        if sandbox.server is not None:
            sandbox.server.close()
        if sandbox.writer is not None:
            sandbox.writer.close()
        self._clear(sandbox)
        _unlink(sandbox.path)

    # -- queries ----------------------------------------------------------------------------------------
    def state(self, sandbox_id: str) -> P.SandboxState | None:
        sandbox = self._sandboxes.get(sandbox_id)
        return None if sandbox is None or sandbox.state is None else copy.deepcopy(sandbox.state)

    def snapshot(self) -> dict[str, P.SandboxState]:
        return {sid: copy.deepcopy(s.state) for sid, s in self._sandboxes.items() if s.state is not None}

    def connected(self, sandbox_id: str) -> bool:
        sandbox = self._sandboxes.get(sandbox_id)
        return sandbox is not None and sandbox.state is not None

    # -- requests to an execd -----------------------------------------------------------------------------
    async def request(self, sandbox_id: str, message: P.Message) -> P.Message:
        """Send ``message`` to the sandbox's execd and wait for its reply (raise UnavailableError if none)."""
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            raise NotFoundError(f"no sandbox {sandbox_id!r} on this control hub")
        if sandbox.writer is None or sandbox.state is None:
            raise UnavailableError(f"execd of sandbox {sandbox_id} is not connected")
        request_id = next(self._ids)
        future: asyncio.Future[P.Message] = asyncio.get_running_loop().create_future()
        sandbox.pending[request_id] = future
        try:
            sandbox.writer.write(P.encode({**message, "requestId": request_id}))
            await asyncio.wait_for(sandbox.writer.drain(), WRITE_TIMEOUT)
            return await asyncio.wait_for(future, self.request_timeout)
        except (OSError, TimeoutError) as exc:
            raise UnavailableError(f"execd of sandbox {sandbox_id} did not answer: {exc!r}") from None
        finally:
            sandbox.pending.pop(request_id, None)

    async def close_admission(self, sandbox_id: str, expected_version: int) -> P.Message:
        """IDLE-6: ``{"ok": true, ...}`` if execd closed admission at ``expected_version``, else ``ok: false``."""
        return await self.request(sandbox_id, {"type": P.CLOSE_ADMISSION, "expectedVersion": expected_version})

    async def open_admission(self, sandbox_id: str) -> P.Message:
        return await self.request(sandbox_id, {"type": P.OPEN_ADMISSION})

    async def ack_checkpoint(self, sandbox_id: str, operation_id: str) -> None:
        """sandboxd took the checkpoint request over: execd drops it from its pending list (no reply)."""
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            raise NotFoundError(f"no sandbox {sandbox_id!r} on this control hub")
        message: P.Message = {"type": P.CHECKPOINT_ACK, "operationId": operation_id}
        if sandbox.state is not None and P.apply_event(sandbox.state, message):
            self._changed(sandbox)
        if sandbox.writer is not None:
            sandbox.writer.write(P.encode(message))
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(sandbox.writer.drain(), WRITE_TIMEOUT)

    # -- execd side ---------------------------------------------------------------------------------------
    async def _serve_execd(self, sandbox: _Sandbox, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.verify_execd is not None:
            try:
                pid = peer_pid(writer.get_extra_info("socket"))
                allowed = self.verify_execd(sandbox.id, pid)
            except OSError:
                pid, allowed = -1, False
            if not allowed:
                # Refused before it can touch the current connection or the observation.
                log.warning("refused a control connection", extra={"sandbox": sandbox.id, "peer_pid": pid})
                writer.close()
                return
        if sandbox.writer is not None:
            sandbox.writer.close()  # the newest connection wins: an old one may be half-dead
            self._clear(sandbox)
        sandbox.writer = writer
        sandbox.connections += 1
        generation = sandbox.connections
        try:
            first = P.decode(await reader.readline())
            if first["type"] != P.HELLO:
                raise P.ProtocolError(f"first message must be hello, got {first['type']!r}")
            if first.get("protocol") != P.PROTOCOL_VERSION:
                self._refuse(sandbox, first.get("protocol"))
                sandbox.writer = None  # the refusal stays published: the finally below must not clear it
                return
            sandbox.hello = {k: v for k, v in first.items() if k != "state"}
            sandbox.state = P.initial_state()
            P.apply_event(sandbox.state, first)
            self._changed(sandbox, urgent=self._became_ready(sandbox, False))
            while line := await reader.readline():
                message = P.decode(line)
                if message["type"] == P.REPLY:
                    request_id = message.get("requestId")
                    future = sandbox.pending.get(request_id) if isinstance(request_id, int) else None
                    if future is not None and not future.done():
                        future.set_result(message)
                    continue
                was_ready = bool(sandbox.state["ready"])
                if P.apply_event(sandbox.state, message):
                    self._changed(sandbox, urgent=self._became_ready(sandbox, was_ready))
        except (OSError, asyncio.IncompleteReadError, P.ProtocolError, ValueError) as exc:
            log.info("execd control connection failed", extra={"sandbox": sandbox.id, "reason": repr(exc)})
        finally:
            # Only the connection that is still current may clear the observation.
            if sandbox.connections == generation and sandbox.writer is writer:
                sandbox.writer = None
                self._clear(sandbox)
            writer.close()

    def _became_ready(self, sandbox: _Sandbox, was_ready: bool) -> bool:
        """Whether the last event made the sandbox Ready (``on_ready`` is told)."""
        if sandbox.state is None or not sandbox.state["ready"] or was_ready:
            return False
        if self.on_ready is not None:
            self.on_ready(sandbox.id)
        return True

    def _refuse(self, sandbox: _Sandbox, protocol: object) -> None:
        """CTL-8: an execd of another version is refused loudly, never served half-understood; subscribers see
        why (the node fails the execution with this reason instead of waiting for a Ready that cannot come)."""
        reason = (
            f"execd of sandbox {sandbox.id} speaks runtime-control protocol {protocol!r}, sandboxd speaks "
            f"{P.PROTOCOL_VERSION}: upgrade execd, sandboxd and the node together"
        )
        log.error("refused an execd of another version: %s", reason, extra={"sandbox": sandbox.id})
        state = P.initial_state()
        state["refused"] = reason
        sandbox.state = state
        self._changed(sandbox, urgent=True)

    def _clear(self, sandbox: _Sandbox) -> None:
        for future in sandbox.pending.values():
            if not future.done():
                future.set_exception(ConnectionResetError("execd disconnected"))
        if sandbox.state is not None:
            sandbox.state = None
            for sub in self._subscribers:
                sub.cleared.add(sandbox.id)  # a reconnect within the same window must not hide the break
            self._changed(sandbox)

    def _changed(self, sandbox: _Sandbox, *, urgent: bool = False) -> None:
        for sub in self._subscribers:
            sub.dirty[sandbox.id] = None
            if urgent:
                sub.urgent.set()
            sub.wake.set()

    # -- subscriber side --------------------------------------------------------------------------------
    async def _serve_subscriber(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.allowed_uid is not None:
            try:
                uid = peer_uid(writer.get_extra_info("socket"))
            except OSError:
                uid = -1
            if uid != self.allowed_uid:
                log.warning("refused subscriber", extra={"peer_uid": uid})
                writer.write(P.encode({"type": P.REPLY, "requestId": None, "ok": False, "error": "permission_denied"}))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.drain(), 1.0)
                writer.close()
                return
        sub = _Subscriber(writer)
        # Snapshot and registration in one synchronous step: every later change lands in sub.dirty.
        writer.write(
            P.encode({"type": P.SNAPSHOT, "seq": sub.seq, "protocol": P.PROTOCOL_VERSION, "sandboxes": self.snapshot()})
        )
        self._subscribers.add(sub)
        read_task = asyncio.get_running_loop().create_task(self._read_subscriber(sub, reader))
        try:
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
            while not read_task.done():
                wake = asyncio.ensure_future(sub.wake.wait())
                await asyncio.wait({wake, read_task}, return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                sub.wake.clear()
                if sub.dirty:
                    # Coalescing window, leading edge: a change after a quiet window goes out at once; changes
                    # within ``coalesce`` of the last flush settle into one delta per sandbox. An urgent change
                    # (Ready, a refusal: a node's start waits for it) never waits for the window: a claimed
                    # member's execd connects and reports Ready a few ms apart, and Ready used to wait out the
                    # window the connect's delta opened. sleep(0) lets changes of the same iteration join.
                    loop = asyncio.get_running_loop()
                    hold = sub.last_flush + self.coalesce - loop.time()
                    if hold > 0 and not sub.urgent.is_set():
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(sub.urgent.wait(), hold)  # an urgent change ends the window
                    await asyncio.sleep(0)
                    sub.last_flush = loop.time()
                    sub.urgent.clear()
                    dirty, sub.dirty = sub.dirty, {}
                    cleared, sub.cleared = sub.cleared, set()
                    for sandbox_id in dirty:
                        sandbox = self._sandboxes.get(sandbox_id)
                        state = None if sandbox is None else sandbox.state
                        if sandbox_id in cleared and state is not None:
                            # Lost and back within one window: still show the break (CTL-3), then the state.
                            sub.seq += 1
                            writer.write(
                                P.encode({"type": P.DELTA, "seq": sub.seq, "sandboxId": sandbox_id, "state": None})
                            )
                        sub.seq += 1
                        writer.write(
                            P.encode({"type": P.DELTA, "seq": sub.seq, "sandboxId": sandbox_id, "state": state})
                        )
                    await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            log.info("subscriber dropped", extra={"reason": repr(exc)})
        finally:
            self._subscribers.discard(sub)
            read_task.cancel()
            writer.close()

    async def _read_subscriber(self, sub: _Subscriber, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while line := await reader.readline():
                try:
                    message = P.decode(line)
                except P.ProtocolError as exc:
                    await self._reply(sub, {"type": P.REPLY, "requestId": None, "ok": False, "error": str(exc)})
                    continue
                self._spawn(self._forward(sub, message))

    async def _forward(self, sub: _Subscriber, message: P.Message) -> None:
        request_id = message.get("requestId")
        sandbox_id = message.get("sandboxId")
        kind = message["type"]
        reply: P.Message = {"type": P.REPLY, "requestId": request_id, "sandboxId": sandbox_id}
        answer: P.Message
        try:
            if not isinstance(sandbox_id, str):
                raise NotFoundError("sandboxId must be a string")
            if kind == P.CLOSE_ADMISSION:
                answer = await self.close_admission(sandbox_id, message.get("expectedVersion"))  # type: ignore[arg-type]
            elif kind == P.OPEN_ADMISSION:
                answer = await self.open_admission(sandbox_id)
            elif kind == P.CHECKPOINT_ACK:
                await self.ack_checkpoint(sandbox_id, str(message.get("operationId")))
                answer = {"ok": True}
            else:
                answer = {"ok": False, "error": f"unknown request type {kind!r}"}
            reply.update({k: v for k, v in answer.items() if k not in ("type", "requestId")})
        except (NotFoundError, UnavailableError) as exc:
            reply.update({"ok": False, "error": exc.code, "message": str(exc)})
        await self._reply(sub, reply)

    async def _reply(self, sub: _Subscriber, reply: P.Message) -> None:
        sub.writer.write(P.encode(reply))
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(sub.writer.drain(), WRITE_TIMEOUT)
