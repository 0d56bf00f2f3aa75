"""sandboxd's side of the spawner protocol (see ``_spawner``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

from adx.errors import UnavailableError, UncertainOutcomeError
from adx.sandboxd._spawn_spec import SpawnReport, SpawnSpec

__all__ = ["FAULTS_ENV", "SpawnerProcess"]

FAULTS_ENV = "ADX_SANDBOXD_FAULTS"  # test-only fault points, comma separated

log = logging.getLogger("adx.sandboxd.spawner")


#: The directory that holds the ``adx`` package (the spawner imports only standard-library-only modules of it).
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class SpawnerProcess:
    """Starts the spawner (a fresh, single-threaded interpreter) and talks to it over a socketpair.

    ``start()`` is synchronous and may run before the event loop; ``attach()`` wires the socket to the loop.
    ``execd_python``: run the spawner on this interpreter (the one execd sandboxes exec) with execd preloaded,
    so their PID 1 runs execd in process (see ``_spawner``). Its environment is then only what it needs:
    PID 1's memory starts as a copy of it.
    """

    def __init__(self) -> None:
        self.execd_python: str | None = None
        self.userns = False  # prepared inits get a user namespace of their own (sandboxd's user_namespace)
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[SpawnReport]] = {}
        self._next = 0
        self._task: asyncio.Task[None] | None = None
        self._restart_lock = asyncio.Lock()

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [sys.executable, "-m", "adx.sandboxd._spawner", str(theirs.fileno())]
        if self.userns:
            argv.append("--userns")
        env = None
        if self.execd_python is not None:
            # The room: PID 1 rewrites its argv and environ areas (copies of these) to execd's own.
            argv = [self.execd_python, "-s", *argv[1:], "--execd", " " * 4096]
            env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": _PACKAGE_ROOT, "_": " " * 4096}
            if FAULTS_ENV in os.environ:
                env[FAULTS_ENV] = os.environ[FAULTS_ENV]
        self._proc = subprocess.Popen(
            argv, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, close_fds=True, env=env
        )
        theirs.close()
        self._sock = ours

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    async def attach(self) -> None:
        assert self._sock is not None
        self._reader, self._writer = await asyncio.open_unix_connection(sock=self._sock, limit=1 << 20)
        self._task = asyncio.create_task(self._read_loop(), name="spawner-reader")

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while line := await self._reader.readline():
                msg = json.loads(line)
                fut = self._pending.pop(int(msg.pop("req")), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(UncertainOutcomeError("the spawner exited while a sandbox was starting"))
            self._pending.clear()

    async def _restart(self) -> None:
        """Replace a dead spawner. Safe from the threaded daemon: Popen execs a fresh interpreter at once."""
        log.warning("the sandbox spawner exited (status %s); starting a new one", self._proc and self._proc.poll())
        if self._writer is not None:
            self._writer.close()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self._writer = self._reader = None
        self.start()
        await self.attach()

    async def spawn(self, spec: SpawnSpec, deadline_seconds: float) -> SpawnReport:
        """Returns the supervisor's report. Raises UncertainOutcomeError when the outcome is unknown."""
        if self._writer is None or not self.alive():
            async with self._restart_lock:
                if self._writer is None or not self.alive():
                    try:
                        await self._restart()
                    except OSError as exc:
                        raise UnavailableError(f"the sandbox spawner cannot be started: {exc}") from exc
        assert self._writer is not None
        self._next += 1
        req = self._next
        fut: asyncio.Future[SpawnReport] = asyncio.get_running_loop().create_future()
        self._pending[req] = fut
        self._writer.write(json.dumps({"req": req, "spec": spec.to_wire()}).encode() + b"\n")
        await self._writer.drain()
        try:
            return await asyncio.wait_for(fut, deadline_seconds)
        except TimeoutError:
            self._pending.pop(req, None)
            raise UncertainOutcomeError(f"the supervisor did not report within {deadline_seconds}s") from None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._proc is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(self._proc.wait), 5.0)
            except TimeoutError:
                self._proc.kill()
