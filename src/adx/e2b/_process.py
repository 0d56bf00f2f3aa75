"""envd's ``process.Process`` service on execd's commands API.

| RPC | execd |
|---|---|
| ``Start`` (server stream) | ``POST /v1/commands`` streamed (NDJSON, base64), re-encoded as ProcessEvents |
| ``Connect`` (server stream) | the command found by PID or tag: its live output from here on, then its end |
| ``List`` | ``GET /v1/commands`` (running ones) |
| ``SendSignal`` | ``POST /v1/commands/{id}/kill`` |
| ``SendInput`` / ``StreamInput`` / ``CloseStdin`` | ``POST /v1/commands/{id}/stdin[?close=true]`` (stdin or PTY) |
| ``Update`` (PTY resize) | ``POST /v1/commands/{id}/resize`` |

A ``Start`` with ``pty`` runs the command on a pseudo-terminal in execd (``"pty": {"rows", "cols"}``); its output
is one stream, sent as ``data.pty`` events.

``Connect`` streams live output from the reader of the command's ``Start`` stream in this process (which keeps
reading after its client left): every frame it reads is also handed to each connected client, from the moment
it connects, as envd's ``Connect`` does for the SDK (envd replays earlier output only when the request asks,
which the SDK's ``ConnectRequest`` cannot). A command this process does not stream (another API process started
it) is followed by its status only.

A ``Start``'s ``tag`` is kept with its config: ``List`` answers it, and a ``ProcessSelector`` by tag finds the
running command this process started with it (as envd's tags; another API process's are not known here).

A started process outlives its stream as in envd: when the client goes away before the end, the execd stream
is drained in the background instead of being dropped (which would kill the command); the call's deadline
(``Connect-Timeout-Ms``) bounds the command itself, as envd's does, and at it the stream ends with Connect's
``deadline_exceeded``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from adx.e2b._connect import STREAM_TYPE, RpcError, end_stream, envelope, envelopes, single_message, timeout_seconds
from adx.e2b._ends import UNKNOWN_END, EndEvent, Frame, end_of, frame_of
from adx.e2b._messages import (
    ConnectRequest,
    ProcessInput,
    ProcessSelector,
    SendInputRequest,
    SendSignalRequest,
    StartRequest,
    StreamInputMessage,
    UpdateRequest,
    handler_of,
    message_as,
)
from adx.e2b._upstream import CommandBody, Execd, WindowBody, chunks, close, read_all, rpc_error_of
from adx.model import CommandList, CommandStarted, CommandState, CommandStatus, ExitFrame, OutputFrame

#: Output frames queued towards one client before execd is slowed down (backpressure, not loss).
QUEUE_FRAMES = 64
CONNECT_POLL_SECONDS = 0.5
_SIGNALS = {"SIGNAL_SIGKILL": "SIGKILL", "SIGNAL_SIGTERM": "SIGTERM", 9: "SIGKILL", 15: "SIGTERM"}
# Streams whose client left: kept referenced until their command ends.
_DETACHED: set[asyncio.Task[None]] = set()
#: The final frames of commands this process streamed, by (tenant, Environment, pid): execd forgets a finished
#: foreground command, so a Connect that finds it gone reports its end from here (newest FINISHED_KEPT only).
_FINISHED: OrderedDict[tuple[str, str, int], ExitFrame] = OrderedDict()
FINISHED_KEPT = 1024
#: The readers of running commands' output, by (tenant, Environment, pid), for Connect.
_LIVE: dict[tuple[str, str, int], _Pump] = {}
#: Frames queued towards one connected client; a client that falls this far behind is ended with an error.
FOLLOWER_FRAMES = 1024


def _keepalive_interval(request: Request) -> float | None:
    raw = request.headers.get("keepalive-ping-interval", "")
    try:
        return max(1.0, float(raw)) if raw else None
    except ValueError:
        return None


def _event(name: str, value: dict[str, object]) -> bytes:
    return envelope({"event": {name: value}})


def _end(end: EndEvent) -> bytes:
    return _event("end", end.wire()) + end_stream()


def _data(frame: OutputFrame) -> bytes:
    """envd's DataEvent (``{"stdout"|"stderr"|"pty": base64}``); empty output is not sent."""
    return _event("data", {frame.stream: frame.data}) if frame.data else b""


class _Lost:
    """Handed to a connected client that fell too far behind: it is ended with an error."""


#: What a connected client's queue carries: frames as read, then None at the end of the stream.
_Followed = Frame | _Lost | None


@dataclass(frozen=True)
class StartedConfig:
    """A process's config as its ``Start`` gave it: envd's ``List`` answers it (execd keeps only the argv)."""

    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str | None
    tag: str | None = None  # ProcessInfo's, beside the config

    def wire(self) -> dict[str, object]:
        config: dict[str, object] = {"cmd": self.cmd, "args": self.args, "envs": self.envs}
        if self.cwd is not None:
            config["cwd"] = self.cwd
        return config


def sandbox_variables(execd: Execd, template: str) -> dict[str, str]:
    """What E2B sets for every command (its docs: 'knowing if you are inside a sandbox'); the command's own
    ``envs`` come on top. The create's ``envs`` are the Environment's own, under both (execd's order)."""
    return {
        "E2B_SANDBOX": "true",
        "E2B_SANDBOX_ID": execd.environment_id,
        "E2B_TEAM_ID": execd.tenant,
        "E2B_TEMPLATE_ID": template,
    }


class _Pump:
    """Reads execd's NDJSON frames into a bounded queue; once detached, drains them to the end unseen."""

    def __init__(self, upstream: Response, execd: Execd, config: StartedConfig) -> None:
        self.upstream = upstream
        self.config = config
        self.key = (execd.tenant, execd.environment_id)
        self.pid = 0
        self.started = time.monotonic()
        self.queue: asyncio.Queue[Frame | BaseException | None] = asyncio.Queue(QUEUE_FRAMES)
        self.detached = False
        self.followers: set[asyncio.Queue[_Followed]] = set()
        self.task = asyncio.create_task(self._run(), name="e2b-process-stream")

    async def _put(self, item: Frame | BaseException | None) -> None:
        if not self.detached:
            await self.queue.put(item)

    async def _run(self) -> None:
        pending = b""
        try:
            async for chunk in chunks(self.upstream):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        frame = frame_of(line)
                        self._remember(frame)
                        self._fan_out(frame)
                        await self._put(frame)
            await self._put(None)
        except Exception as exc:
            await self._put(exc)
        finally:
            if _LIVE.get((*self.key, self.pid)) is self:
                del _LIVE[(*self.key, self.pid)]
            for follower in list(self.followers):
                self._give(follower, None)
            await close(self.upstream)

    def _give(self, follower: asyncio.Queue[_Followed], frame: Frame | None) -> None:
        try:
            follower.put_nowait(frame)
        except asyncio.QueueFull:  # too slow a client: it is ended with an error, never fed a gap in silence
            self.followers.discard(follower)
            follower.get_nowait()
            follower.put_nowait(_Lost())

    def _fan_out(self, frame: Frame) -> None:
        for follower in list(self.followers):
            self._give(follower, frame)

    def follow(self) -> asyncio.Queue[_Followed]:
        follower: asyncio.Queue[_Followed] = asyncio.Queue(FOLLOWER_FRAMES)
        self.followers.add(follower)
        return follower

    def _remember(self, frame: Frame) -> None:
        if isinstance(frame, CommandStarted):
            self.pid = frame.pid
            _LIVE[(*self.key, self.pid)] = self
        elif isinstance(frame, ExitFrame) and self.pid:
            _FINISHED[(*self.key, self.pid)] = frame
            while len(_FINISHED) > FINISHED_KEPT:
                _FINISHED.popitem(last=False)

    def detach(self) -> None:
        self.detached = True
        while not self.queue.empty():  # a producer blocked on a full queue must see the flag
            self.queue.get_nowait()
        if not self.task.done():
            _DETACHED.add(self.task)
            self.task.add_done_callback(_DETACHED.discard)


async def _start_events(pump: _Pump, keepalive: float | None) -> AsyncIterator[bytes]:
    finished = False
    try:
        while True:
            try:
                item = await asyncio.wait_for(pump.queue.get(), keepalive)
            except TimeoutError:
                yield _event("keepalive", {})
                continue
            if item is None or isinstance(item, BaseException):
                reason = f": {item!r}" if item is not None else ""
                yield end_stream(RpcError("unavailable", f"the command's output stream was lost{reason}"))
                finished = True
                return
            if isinstance(item, CommandStarted):
                yield _event("start", {"pid": item.pid})
            elif isinstance(item, OutputFrame):
                if item.data:
                    yield _data(item)
            else:
                if item.timed_out:
                    # envd's stream ends with the call's context: Connect's deadline_exceeded, no end event
                    # (the SDK raises TimeoutException, not a CommandExitException with exit -1).
                    yield end_stream(RpcError("deadline_exceeded", "context deadline exceeded"))
                else:
                    yield _end(end_of(item))
                finished = True
                return
    finally:
        if not finished:
            pump.detach()  # the client left first: the command keeps running, as envd's do


@dataclass
class ProcessService:
    execd: Execd
    user: str  # the account a started process runs as (E2B's ``user`` by default), in its home
    template: Callable[[], Awaitable[str]]  # the sandbox's template (image), asked only by ``Start``

    async def dispatch(self, method: str, request: Request) -> Response:
        handler = handler_of(
            "process.Process",
            method,
            {
                "Start": self.start,
                "Connect": self.connect,
                "List": self.list,
                "SendSignal": self.send_signal,
                "SendInput": self.send_input,
                "StreamInput": self.stream_input,
                "CloseStdin": self.close_stdin,
                "Update": self.update,
            },
        )
        return await handler(request)

    async def start(self, request: Request) -> Response:
        message = message_as(StartRequest, await single_message(request))
        process = message.process
        body: CommandBody = {"argv": [process.cmd, *process.args], "encoding": "base64", "user": self.user}
        body["env"] = {**sandbox_variables(self.execd, await self.template()), **process.envs}
        if process.cwd:
            body["cwd"] = process.cwd  # a relative one is in the user's home: execd resolves it
        if message.pty is not None:
            body["pty"] = {"rows": message.pty.size.rows, "cols": message.pty.size.cols}
        elif message.stdin:
            body["keepStdinOpen"] = True
        deadline = timeout_seconds(request)
        if deadline is not None:
            body["timeoutSeconds"] = deadline
        upstream = await self.execd.open("POST", "/v1/commands", json_body=body, read_timeout=None)
        if upstream.status_code != 200:
            raise rpc_error_of(upstream.status_code, await read_all(upstream))
        config = StartedConfig(process.cmd, process.args, process.envs, process.cwd or None, message.tag)
        pump = _Pump(upstream, self.execd, config)
        return StreamingResponse(_start_events(pump, _keepalive_interval(request)), media_type=STREAM_TYPE)

    async def _commands(self) -> list[CommandStatus]:
        status, body = await self.execd.call("GET", "/v1/commands")
        if status != 200:
            raise rpc_error_of(status, body)
        return CommandList.model_validate_json(body).commands

    async def _find(self, selector: ProcessSelector) -> CommandStatus:
        pid = selector.pid
        if pid is None:
            pid = self._tagged(selector.tag)
        for command in await self._commands():
            if command.pid == pid and command.state is CommandState.RUNNING:
                return command
        # A tagged process that ended a moment ago can still be in this process's table (its output pump closes
        # after execd reports the end): the caller named a tag, so the answer names it too, as envd's does.
        named = f"pid {pid}" if selector.pid is not None else f"tag {selector.tag}"
        raise RpcError("not_found", f"process with {named} not found")

    def _tagged(self, tag: str | None) -> int:
        """The PID of the running command started here with ``tag`` (the newest, if several)."""
        if tag is None:
            raise RpcError("invalid_argument", "process: give pid or tag")
        key = (self.execd.tenant, self.execd.environment_id)
        found = [pid for (*owner, pid), pump in _LIVE.items() if tuple(owner) == key and pump.config.tag == tag]
        if not found:
            raise RpcError("not_found", f"process with tag {tag} not found")
        return max(found, key=lambda pid: _LIVE[(*key, pid)].started)

    async def list(self, request: Request) -> Response:
        await single_message(request)
        processes = []
        for command in await self._commands():
            if command.state is not CommandState.RUNNING:
                continue
            pump = _LIVE.get((self.execd.tenant, self.execd.environment_id, command.pid))
            if pump is not None:
                config = pump.config
            else:  # started through another API process: execd knows only its argv
                argv = command.argv or [""]
                config = StartedConfig(argv[0], argv[1:], {}, None)
            process: dict[str, object] = {"config": config.wire(), "pid": command.pid}
            if config.tag is not None:
                process["tag"] = config.tag
            processes.append(process)
        return JSONResponse({"processes": processes})

    async def send_signal(self, request: Request) -> Response:
        message = message_as(SendSignalRequest, await single_message(request))
        name = _SIGNALS.get(message.signal)
        if name is None:
            raise RpcError(
                "invalid_argument", f"signal: must be SIGNAL_SIGKILL or SIGNAL_SIGTERM, got {message.signal!r}"
            )
        command = await self._find(message.process)
        status, body = await self.execd.call("POST", f"/v1/commands/{command.id}/kill", json_body={"signal": name})
        if status != 200:
            raise rpc_error_of(status, body)
        if not json.loads(body).get("delivered"):
            raise RpcError("not_found", f"process with pid {command.pid} not found")
        return JSONResponse({})

    async def _write_stdin(self, command_id: str, data: bytes, *, close_stdin: bool = False) -> None:
        query = {"close": "true"} if close_stdin else None
        status, body = await self.execd.call(
            "POST",
            f"/v1/commands/{command_id}/stdin",
            query=query,
            content=data,
            content_type="application/octet-stream",
        )
        if status != 200:
            raise rpc_error_of(status, body)

    async def send_input(self, request: Request) -> Response:
        message = message_as(SendInputRequest, await single_message(request))
        command = await self._find(message.process)
        await self._write_stdin(command.id, _stdin_bytes(message.input))
        return JSONResponse({})

    async def stream_input(self, request: Request) -> Response:
        command: CommandStatus | None = None
        try:
            async for raw in envelopes(request):
                message = message_as(StreamInputMessage, raw)
                if message.start is not None:
                    command = await self._find(message.start.process)
                elif message.data is not None:
                    if command is None:
                        raise RpcError("failed_precondition", "the input stream must start with a start event")
                    await self._write_stdin(command.id, _stdin_bytes(message.data.input))
        except RpcError as exc:
            return Response(end_stream(exc), media_type=STREAM_TYPE)
        return Response(envelope({}) + end_stream(), media_type=STREAM_TYPE)

    async def close_stdin(self, request: Request) -> Response:
        message = message_as(ConnectRequest, await single_message(request))
        command = await self._find(message.process)
        await self._write_stdin(command.id, b"", close_stdin=True)
        return JSONResponse({})

    async def update(self, request: Request) -> Response:
        message = message_as(UpdateRequest, await single_message(request))
        if message.pty is None:
            return JSONResponse({})  # nothing to change
        size: WindowBody = {"rows": message.pty.size.rows, "cols": message.pty.size.cols}
        command = await self._find(message.process)
        status, body = await self.execd.call("POST", f"/v1/commands/{command.id}/resize", json_body=size)
        if status != 200:
            raise rpc_error_of(status, body)
        return JSONResponse({})

    async def connect(self, request: Request) -> Response:
        message = message_as(ConnectRequest, await single_message(request))
        command = await self._find(message.process)
        keepalive = _keepalive_interval(request) or CONNECT_POLL_SECONDS * 20
        pump = _LIVE.get((self.execd.tenant, self.execd.environment_id, command.pid))
        if pump is not None:
            return StreamingResponse(self._live(pump, command.pid, keepalive), media_type=STREAM_TYPE)
        return StreamingResponse(self._follow(command, keepalive), media_type=STREAM_TYPE)

    async def _live(self, pump: _Pump, pid: int, keepalive: float) -> AsyncIterator[bytes]:
        follower = pump.follow()
        try:
            yield _event("start", {"pid": pid})
            while True:
                try:
                    frame = await asyncio.wait_for(follower.get(), keepalive)
                except TimeoutError:
                    yield _event("keepalive", {})
                    continue
                if frame is None:
                    yield end_stream(RpcError("unavailable", "the command's output stream was lost"))
                    return
                if isinstance(frame, _Lost):
                    yield end_stream(RpcError("resource_exhausted", "the client fell behind its output"))
                    return
                if isinstance(frame, OutputFrame):
                    if frame.data:
                        yield _data(frame)
                elif isinstance(frame, ExitFrame):
                    yield _end(end_of(frame))
                    return
        finally:
            pump.followers.discard(follower)

    async def _follow(self, command: CommandStatus, keepalive: float) -> AsyncIterator[bytes]:
        yield _event("start", {"pid": command.pid})
        quiet = 0.0
        while True:
            await asyncio.sleep(CONNECT_POLL_SECONDS)
            status, body = await self.execd.call("GET", f"/v1/commands/{command.id}")
            if status == 404:  # a finished foreground command is forgotten by execd
                seen = _FINISHED.get((self.execd.tenant, self.execd.environment_id, command.pid))
                yield _end(end_of(seen) if seen is not None else UNKNOWN_END)
                return
            if status != 200:
                yield end_stream(rpc_error_of(status, body))
                return
            current = CommandStatus.model_validate_json(body)
            if current.state is not CommandState.RUNNING:
                yield _end(end_of(current))
                return
            quiet += CONNECT_POLL_SECONDS
            if quiet >= keepalive:
                quiet = 0.0
                yield _event("keepalive", {})


def _stdin_bytes(value: ProcessInput | None) -> bytes:
    """``ProcessInput``: ``stdin`` or ``pty`` bytes; both are written to what the command reads (pipe or PTY)."""
    given = [] if value is None else [(k, d) for k, d in (("stdin", value.stdin), ("pty", value.pty)) if d is not None]
    if not given:
        raise RpcError("invalid_argument", "input: give stdin or pty")
    kind, data = given[0]
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error:
        raise RpcError("invalid_argument", f"input.{kind}: must be base64") from None
