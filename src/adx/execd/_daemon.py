"""The execd daemon: HTTP routes, workload, probe, control reporting and PID 1 shutdown.

Client socket routes (each is a *client operation*: counted in activity and subject to admission, except
``/v1/health`` and the workload's ``/v1/checkpoint-requests``):

- ``GET  /v1/health``
- ``POST /v1/commands`` run; foreground streams NDJSON frames, ``"background": true`` returns an ID;
  ``"user"``: as that account, with its HOME, in its home unless ``cwd`` says otherwise
- ``GET  /v1/commands`` list; ``GET /v1/commands/{id}``; ``DELETE /v1/commands/{id}`` (finished only)
- ``GET  /v1/commands/{id}/output?stream=stdout|stderr&offset=N&limit=N`` (background ring buffer)
- ``POST /v1/commands/{id}/stdin[?close=true]`` raw body; ``POST /v1/commands/{id}/kill`` ``{"signal":..}``;
  ``POST /v1/commands/{id}/resize`` ``{"rows","cols"}`` (a command run with ``"pty": {"rows","cols"}``)
- ``GET|PUT|DELETE /v1/files?path=``; ``GET /v1/files/stat?path=``; ``GET /v1/files/list?path=``;
  ``POST /v1/files/mkdir?path=``; ``POST /v1/files/rename?path=&to=``; each with an optional ``&user=``
- ``POST /v1/watchers`` ``{"path", "recursive"?, "user"?}`` -> ``{"id"}``; ``GET /v1/watchers/{id}/events?wait=s``
  (long-poll, drains the queue); ``DELETE /v1/watchers/{id}`` (inotify, :mod:`adx.execd._watch`)
- ``POST /v1/checkpoint-requests`` ``{"operationId"?, "reason"?}`` (the workload asks for a checkpoint)

Admin socket routes (control operations, never counted as activity, never gated):
``GET /v1/activity``, ``POST /v1/admission/close`` ``{"expectedVersion": n}``, ``POST /v1/admission/open``,
``GET /v1/health``.
"""

from __future__ import annotations

import asyncio
import binascii
import codecs
import contextlib
import json
import logging
import os
import signal
import socket
import time
from typing import Any

from adx.execd import _protocol as P
from adx.execd._accounts import AccountError, Identity, ensure_account, under_home
from adx.execd._activity import Activity, AdmissionClosed
from adx.execd._control import ControlClient
from adx.execd._files import handle_files
from adx.execd._http import HttpError, Request, Response, account, invalid, serve_connection
from adx.execd._options import ExecdOptions
from adx.execd._procs import Command, ProcessTable, SpawnError, set_window_size
from adx.execd._watch import Watchers, handle_watchers

__all__ = ["Execd"]

log = logging.getLogger("adx.execd")

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


def _unlink(path: str) -> None:
    # Local metadata calls take microseconds: not worth a thread hop.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _frame(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def _window_size(value: Any, field: str) -> tuple[int, int]:
    """``{"rows", "cols"}`` of a terminal, each 1-65535 (the kernel's unsigned short)."""
    if not isinstance(value, dict):
        raise invalid(field, "must be an object {rows, cols}")
    _strict_fields(value, frozenset({"rows", "cols"}))
    sizes = []
    for key in ("rows", "cols"):
        size = value.get(key)
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 65535:
            raise invalid(f"{field}.{key}", "must be an integer 1-65535")
        sizes.append(size)
    return sizes[0], sizes[1]


def _account_env(who: Identity) -> dict[str, str]:
    return {"HOME": who.home, "USER": who.name, "LOGNAME": who.name}


def _strict_fields(body: dict[str, Any], allowed: frozenset[str]) -> None:
    for key in body:
        if key not in allowed:
            raise invalid(key, "unknown field")


class Execd:
    def __init__(self, options: ExecdOptions) -> None:
        self.options = options
        self.activity = Activity()
        self.procs = ProcessTable(ring_capacity=options.ring_bytes)
        self.procs.on_finished.append(self._on_finished)
        self.control = (
            ControlClient(
                options.control_socket,
                sandbox_id=options.sandbox_id,
                execution_id=options.execution_id,
                activity=self.activity,
                coalesce=options.coalesce_seconds,
            )
            if options.control_socket
            else None
        )
        # The environment of the workload and of commands: execd's own, minus what only execd needed (e.g. the
        # PYTHONPATH that points at execd's modules inside the sandbox).
        self.base_env = {k: v for k, v in os.environ.items() if k not in set(options.unset_env)}
        if options.user is not None:
            # The image's account (E2B's ``user``): resolved here, inside, from the image's own /etc/passwd.
            try:
                who = ensure_account(options.user)
            except AccountError as exc:
                raise SpawnError("user", exc.reason) from None
            self.procs.identity = who
            self.base_env.update(_account_env(who))
        self.started_at = time.time()
        self.ready = False
        self.workload: Command | None = None
        self.exit_code = 0
        self._stop = asyncio.Event()
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._checkpoint_ops: set[str] = set()
        self.watchers = Watchers()

    # -- lifecycle --------------------------------------------------------------------------------------
    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def emit(self, message: dict[str, Any]) -> None:
        if self.control is not None:
            self.control.emit(message)

    async def _listen(self, path: str | None, fd: int | None, handler: Any) -> None:
        def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> Any:
            return serve_connection(r, w, handler)

        if fd is not None:
            # Socket activation: the host bound and listens on a path the sandbox cannot see; we only accept.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd)
            sock.set_inheritable(False)  # commands and the workload must not inherit the listener
            server = await asyncio.start_unix_server(serve, sock=sock, limit=64 * 1024)
        else:
            assert path is not None
            _unlink(path)  # a stale socket from a previous execd of this sandbox
            server = await asyncio.start_unix_server(serve, path, limit=64 * 1024)
            os.chmod(path, self.options.socket_mode)
        self._servers.append(server)

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or the workload exits); return the process exit status."""
        loop = asyncio.get_running_loop()
        self.procs.install_reaper()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        await self._listen(self.options.socket, self.options.socket_fd, self._client_handler)
        if self.options.admin_socket is not None or self.options.admin_socket_fd is not None:
            await self._listen(self.options.admin_socket, self.options.admin_socket_fd, self._admin_handler)
        if self.control is not None:
            self.control.start()
        if self.options.workload:
            try:
                self.workload = self.procs.spawn(
                    list(self.options.workload),
                    kind="workload",
                    capture=False,
                    cwd=self.options.workload_cwd,
                    env=self.base_env,
                )
            except SpawnError as exc:
                log.error("workload did not start", extra={"reason": str(exc)})
                self.emit({"type": P.WORKLOAD_EXITED, "exitCode": 127})
                self.exit_code = 127
                self._stop.set()
        if self.options.probe_command or self.options.probe_tcp_port:
            self._spawn_task(self._probe_loop())
        else:
            self._set_ready()
        where = self.options.socket or f"fd {self.options.socket_fd}"
        log.info("execd serving", extra={"socket": where, "pid": os.getpid()})
        await self._stop.wait()
        await self._shutdown()
        return self.exit_code

    def _set_ready(self) -> None:
        if not self.ready and not self._stop.is_set():
            self.ready = True
            self.emit({"type": P.READY})

    async def _shutdown(self) -> None:
        """PID 1 exit: stop serving, forward SIGTERM to every process group, then SIGKILL after the grace."""
        for server in self._servers:
            server.close()
        self.procs.signal_all(signal.SIGTERM)
        if not await self.procs.wait_all_exited(self.options.grace_seconds):
            self.procs.signal_all(signal.SIGKILL)
            await self.procs.wait_all_exited(2.0)
        for task in list(self._tasks):
            task.cancel()
        if self.control is not None:
            await self.control.drain(0.5)
            await self.control.stop()
        for path in (self.options.socket, self.options.admin_socket):
            if path is not None:
                _unlink(path)

    def _on_finished(self, command: Command) -> None:
        if command.kind == "command" and command.background:
            self.activity.background_exited()
        elif command.kind == "workload":
            code = command.exit_code if command.exit_code is not None else 255
            log.info("workload exited", extra={"exit_code": code})
            self.emit({"type": P.WORKLOAD_EXITED, "exitCode": code})
            # During a shutdown the workload dies of our SIGTERM: that is a clean exit, not the workload's status.
            if self.options.exit_with_workload and not self._stop.is_set():
                self.exit_code = code
                self._stop.set()

    # -- probe (explicit health failures are pushed, RST-6) ----------------------------------------------
    async def _probe_once(self) -> str | None:
        """None if healthy, else the reason."""
        timeout = self.options.probe_timeout
        if self.options.probe_tcp_port is not None:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.options.probe_tcp_port), timeout
                )
            except TimeoutError:
                return f"tcp port {self.options.probe_tcp_port}: timed out after {timeout}s"
            except OSError as exc:
                return f"tcp port {self.options.probe_tcp_port}: {exc.strerror or exc}"
            writer.close()
            return None
        assert self.options.probe_command is not None
        try:
            command = self.procs.spawn(
                ["/bin/sh", "-c", self.options.probe_command],
                kind="probe",
                capture=False,
                timeout=timeout,
                env=self.base_env,
            )
        except SpawnError as exc:
            return str(exc)
        await command.done.wait()
        if command.timed_out:
            return f"probe command timed out after {timeout}s"
        if command.exit_code != 0:
            return f"probe command exited with {command.exit_code}"
        return None

    async def _probe_loop(self) -> None:
        failures = 0
        while True:
            reason = await self._probe_once()
            if reason is None:
                if failures:
                    self.emit({"type": P.PROBE, "ok": True, "consecutiveFailures": 0, "reason": None})
                failures = 0
                self._set_ready()  # with a probe, Ready means the workload answered once
            else:
                failures += 1
                log.warning("probe failed", extra={"reason": reason, "consecutive": failures})
                self.emit({"type": P.PROBE, "ok": False, "consecutiveFailures": failures, "reason": reason})
            await asyncio.sleep(self.options.probe_interval)

    # -- HTTP entry points --------------------------------------------------------------------------------
    async def _respond(self, req: Request, resp: Response, route: Any) -> None:
        try:
            await route(req, resp)
        except HttpError as exc:
            if resp.started:
                raise ConnectionAbortedError from exc  # mid-stream: only closing the connection can tell
            await resp.send_json(exc.status, exc.body())
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("request failed", extra={"method": req.method, "path": req.path})
            if resp.started:
                raise ConnectionAbortedError from exc
            await resp.send_json(500, {"error": {"code": "internal", "message": str(exc), "details": {}}})

    async def _client_handler(self, req: Request, resp: Response) -> None:
        if req.path in ("/v1/health", "/v1/checkpoint-requests"):
            # Not client operations: monitoring must not keep a sandbox alive, and the workload asking for a
            # checkpoint must get through while admission is closed for a pause.
            await self._respond(req, resp, self._route_uncounted)
            return
        try:
            self.activity.begin()
        except AdmissionClosed:
            await resp.send_json(
                503,
                {
                    "error": {
                        "code": "admission_closed",
                        "message": "execd is not admitting client operations (the environment is pausing); "
                        "retry after it resumes",
                        "details": {"activityVersion": self.activity.version},
                    }
                },
            )
            return
        try:
            await self._respond(req, resp, self._route_client)
        finally:
            self.activity.end()

    async def _admin_handler(self, req: Request, resp: Response) -> None:
        await self._respond(req, resp, self._route_admin)

    async def _route_uncounted(self, req: Request, resp: Response) -> None:
        if req.path == "/v1/health":
            await self._health(req, resp)
        elif req.method == "POST":
            await self._checkpoint_request(req, resp)
        else:
            raise HttpError(405, "method_not_allowed", f"{req.method} is not allowed on {req.path}")

    async def _route_admin(self, req: Request, resp: Response) -> None:
        route = (req.method, req.path)
        if route == ("GET", "/v1/health"):
            await self._health(req, resp)
        elif route == ("GET", "/v1/activity"):
            await resp.send_json(200, self.activity.snapshot())
        elif route == ("POST", "/v1/admission/close"):
            body = await req.body.json()
            _strict_fields(body, frozenset({"expectedVersion"}))
            expected = body.get("expectedVersion")
            if not isinstance(expected, int) or isinstance(expected, bool) or expected < 0:
                raise invalid("expectedVersion", "required non-negative integer")
            if not self.activity.close_admission(expected):
                raise HttpError(
                    409,
                    "version_changed",
                    f"activity version is {self.activity.version}, not {expected}: admission stays open",
                    {"field": "expectedVersion", "currentVersion": self.activity.version},
                )
            await resp.send_json(200, self.activity.snapshot())
        elif route == ("POST", "/v1/admission/open"):
            await req.body.read_all(1 << 16)
            self.activity.open_admission()
            await resp.send_json(200, self.activity.snapshot())
        else:
            raise HttpError(404, "not_found", f"no route {req.method} {req.path}")

    async def _route_client(self, req: Request, resp: Response) -> None:
        parts = req.path.strip("/").split("/")
        if parts[:2] == ["v1", "commands"]:
            if len(parts) == 2:
                if req.method == "POST":
                    return await self._run(req, resp)
                if req.method == "GET":
                    commands = sorted(self.procs.commands.values(), key=lambda c: c.started_at)
                    return await resp.send_json(200, {"commands": [c.status() for c in commands]})
            elif len(parts) in (3, 4):
                command = self.procs.commands.get(parts[2])
                if command is None:
                    raise HttpError(404, "not_found", f"no command {parts[2]!r}", {"field": "id"})
                action = parts[3] if len(parts) == 4 else ""
                if action == "" and req.method == "GET":
                    return await resp.send_json(200, command.status())
                if action == "" and req.method == "DELETE":
                    if command.running:
                        raise HttpError(409, "conflict", "command is still running; kill it first", {"field": "id"})
                    self.procs.forget(command.id)
                    return await resp.send(204)
                if action == "output" and req.method == "GET":
                    return await self._output(req, resp, command)
                if action == "kill" and req.method == "POST":
                    return await self._kill(req, resp, command)
                if action == "stdin" and req.method == "POST":
                    return await self._stdin(req, resp, command)
                if action == "resize" and req.method == "POST":
                    return await self._resize(req, resp, command)
        elif parts[:2] == ["v1", "watchers"]:
            return await handle_watchers(self.watchers, req, resp, parts[2:])
        elif parts[:2] == ["v1", "files"]:
            action = parts[2] if len(parts) == 3 else "content"
            allowed = {
                "content": ("GET", "PUT", "DELETE"),
                "stat": ("GET",),
                "list": ("GET",),
                "mkdir": ("POST",),
                "rename": ("POST",),
            }
            if len(parts) <= 3 and req.method in allowed.get(action, ()):
                return await handle_files(req, resp, action)
        raise HttpError(404, "not_found", f"no route {req.method} {req.path}")

    async def _health(self, req: Request, resp: Response) -> None:
        await resp.send_json(
            200,
            {
                "status": "ok",
                "ready": self.ready,
                "pid": os.getpid(),
                "uptimeSeconds": round(time.time() - self.started_at, 3),
                "workload": None if self.workload is None else self.workload.status(),
                "orphansReaped": self.procs.orphans_reaped,
                "controlConnected": self.control.connected if self.control is not None else None,
            },
        )

    async def _checkpoint_request(self, req: Request, resp: Response) -> None:
        body = await req.body.json()
        _strict_fields(body, frozenset({"operationId", "reason"}))
        op = body.get("operationId") or os.urandom(8).hex()
        if not isinstance(op, str) or len(op) > 200:
            raise invalid("operationId", "must be a string of at most 200 characters")
        reason = body.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise invalid("reason", "must be a string")
        duplicate = op in self._checkpoint_ops
        if not duplicate:
            self._checkpoint_ops.add(op)
            self.emit({"type": P.CHECKPOINT_REQUEST, "operationId": op, "reason": reason, "requestedAt": time.time()})
        await resp.send_json(202, {"operationId": op, "duplicate": duplicate})

    # -- commands ---------------------------------------------------------------------------------------
    def _parse_run(self, body: dict[str, Any]) -> dict[str, Any]:
        _strict_fields(body, RUN_FIELDS)
        argv = body.get("argv")
        command = body.get("command")
        if (argv is None) == (command is None):
            raise invalid("argv", "give exactly one of argv (list of strings) or command (shell string)")
        if argv is not None:
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise invalid("argv", "must be a non-empty list of strings")
            if any("\x00" in a for a in argv):  # the kernel takes none: subprocess would raise ValueError
                raise invalid("argv", "must not contain NUL")
        else:
            if not isinstance(command, str) or not command.strip():
                raise invalid("command", "must be a non-empty string")
            if "\x00" in command:
                raise invalid("command", "must not contain NUL")
            argv = ["/bin/sh", "-c", command]
        who = account(body["user"]) if body.get("user") is not None else None
        env = dict(self.base_env)
        if who is not None:
            env.update(_account_env(who))
        extra = body.get("env", {})
        if not isinstance(extra, dict):
            raise invalid("env", "must be an object of string values")
        for key, value in extra.items():
            if not isinstance(value, str) or not key or "=" in key or "\x00" in key + value:
                raise invalid(f"env.{key}", "must be a string value with a name without '=' or NUL")
            env[key] = value
        cwd = body.get("cwd")
        if who is not None:
            # As envd: in the account's home unless told otherwise; a relative cwd is in that home too.
            if cwd is None:
                cwd = who.home if os.path.isdir(who.home) else None
            elif isinstance(cwd, str) and cwd:
                cwd = under_home(cwd, who)
        if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
            raise invalid("cwd", "must be an absolute path (or relative to the home of the command's user)")
        timeout = body.get("timeoutSeconds")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT
        ):
            raise invalid("timeoutSeconds", f"must be a number in (0, {MAX_TIMEOUT:.0f}]")
        stdin_data: bytes | None = None
        if "stdin" in body and "stdinBase64" in body:
            raise invalid("stdin", "give at most one of stdin and stdinBase64")
        if "stdin" in body:
            if not isinstance(body["stdin"], str):
                raise invalid("stdin", "must be a string")
            stdin_data = body["stdin"].encode()
        if "stdinBase64" in body:
            if not isinstance(body["stdinBase64"], str):
                raise invalid("stdinBase64", "must be a string")
            try:
                # Strict: the lenient decoder skips characters outside the alphabet instead of refusing them.
                stdin_data = binascii.a2b_base64(body["stdinBase64"].encode(), strict_mode=True)
            except (binascii.Error, UnicodeEncodeError):
                raise invalid("stdinBase64", "is not valid base64") from None
        keep_open = body.get("keepStdinOpen", False)
        background = body.get("background", False)
        for name, value in (("keepStdinOpen", keep_open), ("background", background)):
            if not isinstance(value, bool):
                raise invalid(name, "must be a boolean")
        encoding = body.get("encoding", "utf-8")
        if encoding not in ("utf-8", "base64"):
            raise invalid("encoding", "must be utf-8 or base64")
        pty = body.get("pty")
        if pty is not None:
            pty = _window_size(pty, "pty")
            if background:
                raise invalid("pty", "a PTY is streamed to its client: not with background")
        return {
            "identity": who,
            "pty": pty,
            "argv": argv,
            "env": env,
            "cwd": cwd,
            "timeout": timeout,
            "stdin": stdin_data,
            "keep_open": keep_open,
            "background": background,
            "encoding": encoding,
        }

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
        spec = self._parse_run(await req.body.json())
        try:
            command = self.procs.spawn(
                spec["argv"],
                background=spec["background"],
                env=spec["env"],
                cwd=spec["cwd"],
                stdin=spec["stdin"] is not None or spec["keep_open"],
                timeout=spec["timeout"],
                pty=spec["pty"],
                identity=spec["identity"],
            )
        except SpawnError as exc:
            raise invalid(exc.field, exc.reason) from None
        if spec["pty"] is not None:  # its input is the terminal's: open as long as the PTY is
            if spec["stdin"]:
                self._spawn_task(self._feed_stdin(command, spec["stdin"], True))
        elif spec["stdin"] is not None or spec["keep_open"]:
            self._spawn_task(self._feed_stdin(command, spec["stdin"], spec["keep_open"]))
        if spec["background"]:
            self.activity.background_started()
            await resp.send_json(201, command.status())
            return
        await self._stream_foreground(req, resp, command, spec["encoding"])

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
        _strict_fields(body, frozenset({"signal"}))
        raw = body.get("signal", "SIGKILL")
        try:
            sig = signal.Signals[raw] if isinstance(raw, str) else signal.Signals(raw)
        except (KeyError, ValueError):
            raise invalid("signal", f"unknown signal {raw!r}") from None
        delivered = command.kill(sig)
        await resp.send_json(200, {"id": command.id, "signal": sig.name, "delivered": delivered})

    async def _resize(self, req: Request, resp: Response, command: Command) -> None:
        rows, cols = _window_size(await req.body.json(), "body")
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
