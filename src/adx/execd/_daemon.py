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
- ``POST /v1/watchers`` ``{"path", "recursive"?, "user"?, "entries"?}`` -> ``{"id"}``;
  ``GET /v1/watchers/{id}/events?wait=s`` (long-poll, drains the queue; with ``entries`` a create, write or chmod
  event carries the path's stat); ``DELETE /v1/watchers/{id}`` (inotify, :mod:`adx.execd._watch`)
- ``POST /v1/checkpoint-requests`` ``{"operationId"?, "reason"?}`` (the workload asks for a checkpoint)

Admin socket routes (control operations, never counted as activity, never gated):
``GET /v1/activity``, ``POST /v1/admission/close`` ``{"expectedVersion": n}``, ``POST /v1/admission/open``,
``GET /v1/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from typing import Any

from adx.execd import _protocol as P
from adx.execd._accounts import AccountError, ensure_account
from adx.execd._activity import Activity, AdmissionClosed
from adx.execd._commands import CommandRoutes, account_env
from adx.execd._control import ControlClient
from adx.execd._files import handle_files
from adx.execd._http import HttpError, Request, Response, invalid, serve_connection, strict_fields
from adx.execd._options import ExecdOptions
from adx.execd._procs import Command, ProcessTable, SpawnError
from adx.execd._watch import Watchers, handle_watchers

__all__ = ["Execd"]

log = logging.getLogger("adx.execd")


def _unlink(path: str) -> None:
    # Local metadata calls take microseconds: not worth a thread hop.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


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
            self.base_env.update(account_env(who))
        self.started_at = time.time()
        self.ready = False
        self.workload: Command | None = None
        self.exit_code = 0
        self._stop = asyncio.Event()
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._checkpoint_ops: set[str] = set()
        self.watchers = Watchers()
        self.commands = CommandRoutes(self.procs, self.activity, self.base_env, self._spawn_task)

    # -- lifecycle --------------------------------------------------------------------------------------
    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def emit(self, message: P.Message) -> None:
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
            strict_fields(body, frozenset({"expectedVersion"}))
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
            if await self.commands.handle(req, resp, parts[2:]):
                return
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
        strict_fields(body, frozenset({"operationId", "reason"}))
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
