"""execd's ``/v1/commands`` routes: a run request parsed into a typed :class:`RunRequest`, a foreground
command's NDJSON stream, a background command's output, and kill / resize / stdin of a running one.

The types here are ``typing.NamedTuple``: typed, and nothing to import beyond what execd loads anyway
(``dataclasses`` would add modules to every sandbox's PID 1; execd has a memory budget).
"""

from __future__ import annotations

import asyncio
import binascii
import codecs
import json
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, ClassVar, NamedTuple

from adx.execd._accounts import Identity, under_home
from adx.execd._activity import Activity
from adx.execd._http import HttpError, Request, Response, account, invalid, strict_fields
from adx.execd._procs import Command, ProcessTable, SpawnError, set_window_size

#: How often a foreground command checks whether its client hung up while the command prints nothing.
CLIENT_POLL = 0.2
MAX_TIMEOUT = 7 * 86400.0
STDIN_WRITE_TIMEOUT = 60.0
RUN_FIELDS = frozenset(
    {
        "argv",
        "command",
        "env",
        "cwd",
        "timeoutSeconds",
        "stdin",
        "stdinBase64",
        "keepStdinOpen",
        "background",
        "encoding",
        "pty",
        "user",
    }
)
ENCODINGS = ("utf-8", "base64")


class RunRequest(NamedTuple):
    """``POST /v1/commands``, checked: what to start and how its input and output are handled."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    timeout: float | None
    stdin: bytes | None  # sent to the command's stdin once it runs
    keep_open: bool  # stdin stays open for ``.../stdin`` requests
    background: bool
    encoding: str  # of the output frames: utf-8 or base64
    pty: tuple[int, int] | None  # (rows, cols) of its terminal
    identity: Identity | None  # the account it runs as (None: execd's)


def _frame(value: Mapping[str, object]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def window_size(value: object, field: str) -> tuple[int, int]:
    """``{"rows", "cols"}`` of a terminal, each 1-65535 (the kernel's unsigned short)."""
    if not isinstance(value, dict):
        raise invalid(field, "must be an object {rows, cols}")
    strict_fields(value, frozenset({"rows", "cols"}))
    sizes = []
    for key in ("rows", "cols"):
        size = value.get(key)
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 65535:
            raise invalid(f"{field}.{key}", "must be an integer 1-65535")
        sizes.append(size)
    return sizes[0], sizes[1]


def account_env(who: Identity) -> dict[str, str]:
    return {"HOME": who.home, "USER": who.name, "LOGNAME": who.name}


def _argv(body: Mapping[str, object]) -> list[str]:
    argv = body.get("argv")
    command = body.get("command")
    if (argv is None) == (command is None):
        raise invalid("argv", "give exactly one of argv (list of strings) or command (shell string)")
    if argv is not None:
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise invalid("argv", "must be a non-empty list of strings")
        if any("\x00" in a for a in argv):  # the kernel takes none: subprocess would raise ValueError
            raise invalid("argv", "must not contain NUL")
        return argv
    if not isinstance(command, str) or not command.strip():
        raise invalid("command", "must be a non-empty string")
    if "\x00" in command:
        raise invalid("command", "must not contain NUL")
    return ["/bin/sh", "-c", command]


def _env(body: Mapping[str, object], base_env: Mapping[str, str], who: Identity | None) -> dict[str, str]:
    env = dict(base_env)
    if who is not None:
        env.update(account_env(who))
    extra = body.get("env", {})
    if not isinstance(extra, dict):
        raise invalid("env", "must be an object of string values")
    for key, value in extra.items():
        if not isinstance(value, str) or not key or "=" in key or "\x00" in key + value:
            raise invalid(f"env.{key}", "must be a string value with a name without '=' or NUL")
        env[key] = value
    return env


def _cwd(body: Mapping[str, object], who: Identity | None) -> str | None:
    cwd = body.get("cwd")
    if who is not None:
        # As envd: in the account's home unless told otherwise; a relative cwd is in that home too.
        if cwd is None:
            cwd = who.home if os.path.isdir(who.home) else None
        elif isinstance(cwd, str) and cwd:
            cwd = under_home(cwd, who)
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        raise invalid("cwd", "must be an absolute path (or relative to the home of the command's user)")
    return cwd


def _stdin_data(body: Mapping[str, object]) -> bytes | None:
    if "stdin" in body and "stdinBase64" in body:
        raise invalid("stdin", "give at most one of stdin and stdinBase64")
    text, encoded = body.get("stdin"), body.get("stdinBase64")
    if "stdin" in body:
        if not isinstance(text, str):
            raise invalid("stdin", "must be a string")
        return text.encode()
    if "stdinBase64" in body:
        if not isinstance(encoded, str):
            raise invalid("stdinBase64", "must be a string")
        try:
            # Strict: the lenient decoder skips characters outside the alphabet instead of refusing them.
            return binascii.a2b_base64(encoded.encode(), strict_mode=True)
        except (binascii.Error, UnicodeEncodeError):
            raise invalid("stdinBase64", "is not valid base64") from None
    return None


def parse_run(body: Mapping[str, object], base_env: Mapping[str, str]) -> RunRequest:
    """A run request checked field by field (a 400 names the first bad one, in the order below)."""
    strict_fields(body, RUN_FIELDS)
    argv = _argv(body)
    who = account(body["user"]) if body.get("user") is not None else None
    env = _env(body, base_env, who)
    cwd = _cwd(body, who)
    timeout = body.get("timeoutSeconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT
    ):
        raise invalid("timeoutSeconds", f"must be a number in (0, {MAX_TIMEOUT:.0f}]")
    stdin = _stdin_data(body)
    keep_open = body.get("keepStdinOpen", False)
    background = body.get("background", False)
    for name, value in (("keepStdinOpen", keep_open), ("background", background)):
        if not isinstance(value, bool):
            raise invalid(name, "must be a boolean")
    encoding = body.get("encoding", "utf-8")
    if encoding not in ENCODINGS:
        raise invalid("encoding", "must be utf-8 or base64")
    pty = body.get("pty")
    size = None
    if pty is not None:
        size = window_size(pty, "pty")
        if background:
            raise invalid("pty", "a PTY is streamed to its client: not with background")
    return RunRequest(argv, env, cwd, timeout, stdin, bool(keep_open), bool(background), str(encoding), size, who)


class CommandRoutes:
    """``/v1/commands[/{id}[/{action}]]`` over execd's process table."""

    def __init__(
        self,
        procs: ProcessTable,
        activity: Activity,
        base_env: Mapping[str, str],
        spawn_task: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.procs = procs
        self.activity = activity
        self.base_env = base_env
        self._spawn_task = spawn_task

    async def handle(self, req: Request, resp: Response, parts: list[str]) -> bool:
        """Answer ``req`` (``parts``: its path after ``/v1/commands``); False when no route matches."""
        if not parts:
            if req.method == "POST":
                await self._run(req, resp)
                return True
            if req.method == "GET":
                commands = sorted(self.procs.commands.values(), key=lambda c: c.started_at)
                await resp.send_json(200, {"commands": [c.status() for c in commands]})
                return True
            return False
        if len(parts) > 2:
            return False
        command = self.procs.commands.get(parts[0])
        if command is None:
            raise HttpError(404, "not_found", f"no command {parts[0]!r}", {"field": "id"})
        route = self._ROUTES.get((parts[1] if len(parts) == 2 else "", req.method))
        if route is None:
            return False
        await route(self, req, resp, command)
        return True

    async def _get(self, req: Request, resp: Response, command: Command) -> None:
        await resp.send_json(200, command.status())

    async def _delete(self, req: Request, resp: Response, command: Command) -> None:
        if command.running:
            raise HttpError(409, "conflict", "command is still running; kill it first", {"field": "id"})
        self.procs.forget(command.id)
        await resp.send(204)

    async def _feed_stdin(self, command: Command, data: bytes | None, keep_open: bool) -> None:
        await command.stdin_ready.wait()
        if command.stdin is None:
            return
        try:
            if data:
                await command.stdin.write(data)
        except (BrokenPipeError, ConnectionError):
            return  # the command exited or closed its stdin: not an error of the request
        if not keep_open:
            command.stdin.close()

    async def _run(self, req: Request, resp: Response) -> None:
        run = parse_run(await req.body.json(), self.base_env)
        try:
            command = self.procs.spawn(
                run.argv,
                background=run.background,
                env=run.env,
                cwd=run.cwd,
                stdin=run.stdin is not None or run.keep_open,
                timeout=run.timeout,
                pty=run.pty,
                identity=run.identity,
            )
        except SpawnError as exc:
            raise invalid(exc.field, exc.reason) from None
        if run.pty is not None:  # its input is the terminal's: open as long as the PTY is
            if run.stdin:
                self._spawn_task(self._feed_stdin(command, run.stdin, True))
        elif run.stdin is not None or run.keep_open:
            self._spawn_task(self._feed_stdin(command, run.stdin, run.keep_open))
        if run.background:
            self.activity.background_started()
            await resp.send_json(201, command.status())
            return
        await self._stream_foreground(req, resp, command, run.encoding)

    async def _stream_foreground(self, req: Request, resp: Response, command: Command, encoding: str) -> None:
        """NDJSON frames: start {"id","pid"}; {"stream","data"} as produced; end {"exitCode","signal","timedOut"}."""
        queue = command.queue
        assert queue is not None
        decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr", "pty")}

        def data_frame(stream: str, data: bytes, final: bool = False) -> bytes:
            if encoding == "base64":
                return _frame({"stream": stream, "data": binascii.b2a_base64(data, newline=False).decode()})
            text = decoders[stream].decode(data, final)
            return _frame({"stream": stream, "data": text}) if text else b""

        try:
            await resp.start(200, "application/x-ndjson")
            await resp.write(_frame({"id": command.id, "pid": command.pid}))
            while True:
                item = await queue.get(CLIENT_POLL)
                if item is not None:
                    await resp.write(data_frame(*item))
                    continue
                if command.done.is_set():
                    break
                if req.client_gone():
                    raise ConnectionResetError("client hung up")
            if encoding == "utf-8":
                for stream in ("stdout", "stderr", "pty"):
                    await resp.write(data_frame(stream, b"", final=True))
            await resp.write(
                _frame({"exitCode": command.exit_code, "signal": command.term_signal, "timedOut": command.timed_out})
            )
            await resp.end()
        except BaseException:
            # A foreground command belongs to its request: when the client goes away, so does the command.
            command.kill(signal.SIGKILL)
            raise

    async def _output(self, req: Request, resp: Response, command: Command) -> None:
        stream = req.query.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise invalid("stream", "must be stdout or stderr")
        try:
            offset = int(req.query.get("offset", "0"))
            limit = int(req.query.get("limit", str(1 << 20)))
            if offset < 0 or limit <= 0:
                raise ValueError
        except ValueError:
            raise invalid("offset", "offset must be >= 0 and limit > 0 integers") from None
        buf = command.stdout if stream == "stdout" else command.stderr
        if buf is None:
            raise HttpError(409, "conflict", "only background commands keep output", {"field": "id"})
        actual, data = buf.read(offset, limit)
        encoding = req.query.get("encoding", "utf-8")
        if encoding not in ("utf-8", "base64"):
            raise invalid("encoding", "must be utf-8 or base64")
        text = (
            binascii.b2a_base64(data, newline=False).decode()
            if encoding == "base64"
            else data.decode("utf-8", "replace")
        )
        await resp.send_json(
            200,
            {
                "stream": stream,
                "offset": actual,
                "nextOffset": actual + len(data),
                "droppedBytes": buf.start,
                "data": text,
                "state": "running" if command.running else "exited",
                "exitCode": command.exit_code,
            },
        )

    async def _kill(self, req: Request, resp: Response, command: Command) -> None:
        body = await req.body.json()
        strict_fields(body, frozenset({"signal"}))
        raw = body.get("signal", "SIGKILL")
        try:
            if isinstance(raw, str):
                sig = signal.Signals[raw]
            elif isinstance(raw, int) and not isinstance(raw, bool):  # JSON true is no signal 1 (SIGHUP)
                sig = signal.Signals(raw)
            else:
                raise ValueError(raw)
        except (KeyError, ValueError):
            raise invalid("signal", f"unknown signal {raw!r}") from None
        delivered = command.kill(sig)
        await resp.send_json(200, {"id": command.id, "signal": sig.name, "delivered": delivered})

    async def _resize(self, req: Request, resp: Response, command: Command) -> None:
        rows, cols = window_size(await req.body.json(), "body")
        if command.pty_master is None:
            raise HttpError(409, "conflict", "command has no PTY to resize", {"field": "id"})
        if not command.running:
            raise HttpError(409, "conflict", "command has exited", {"field": "id"})
        set_window_size(command.pty_master, rows, cols)
        await resp.send_json(200, {"id": command.id, "rows": rows, "cols": cols})

    async def _stdin(self, req: Request, resp: Response, command: Command) -> None:
        close = req.query.get("close", "false").lower() in ("true", "1")
        await command.stdin_ready.wait()
        if command.stdin is None:
            raise HttpError(
                409, "conflict", "command was started without an open stdin (keepStdinOpen)", {"field": "id"}
            )
        written = 0
        try:
            while chunk := await req.body.read():
                # Bounded: a command that never reads its stdin must not keep this request active forever.
                await asyncio.wait_for(command.stdin.write(chunk), STDIN_WRITE_TIMEOUT)
                written += len(chunk)
        except BrokenPipeError:
            raise HttpError(409, "conflict", "stdin is closed", {"field": "id"}) from None
        except TimeoutError:
            raise HttpError(
                409,
                "stdin_blocked",
                f"the command did not read its stdin for {STDIN_WRITE_TIMEOUT:.0f}s",
                {"field": "id", "written": written},
            ) from None
        if close:
            command.stdin.close()
        await resp.send_json(200, {"id": command.id, "written": written, "closed": close})

    #: (action, method) -> handler of one command's routes.
    _ROUTES: ClassVar[dict[tuple[str, str], Callable[[CommandRoutes, Request, Response, Command], Awaitable[None]]]] = {
        ("", "GET"): _get,
        ("", "DELETE"): _delete,
        ("output", "GET"): _output,
        ("kill", "POST"): _kill,
        ("stdin", "POST"): _stdin,
        ("resize", "POST"): _resize,
    }
