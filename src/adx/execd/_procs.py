"""Processes started by execd: commands, the workload and probes; reaping as PID 1.

Why not ``asyncio.create_subprocess_exec``: asyncio's child watchers wait on specific PIDs, while PID 1 must
also reap orphans with ``waitpid(-1)``; the two would steal each other's exit statuses. So execd owns one
reaper (on SIGCHLD) that reaps *every* child and dispatches statuses to the processes it started, spawns
with :class:`subprocess.Popen` (exec errors are reported reliably) and never lets Popen wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from typing import TypedDict

from adx.execd._accounts import Identity

__all__ = ["Command", "OutputQueue", "ProcessTable", "RingBuffer", "SpawnError"]

log = logging.getLogger("adx.execd.procs")

#: After a process exits, how long to wait for its pipes to reach EOF (a grandchild may still hold them).
PIPE_DRAIN_AFTER_EXIT = 2.0


def _controlling_terminal() -> None:
    """In the child, after ``setsid()``: make its stdin (the PTY's slave) its controlling terminal."""
    import fcntl  # stdlib C modules, loaded only by a PTY's parent (a sandbox that opens none pays nothing)
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def set_window_size(fd: int, rows: int, cols: int) -> None:
    """TIOCSWINSZ on a PTY: the kernel sends SIGWINCH to the terminal's foreground process group."""
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class SpawnError(Exception):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class RingBuffer:
    """The newest ``capacity`` bytes of a stream; ``start`` counts the bytes dropped from the front."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data = bytearray()
        self.start = 0

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def append(self, chunk: bytes) -> None:
        self.data += chunk
        excess = len(self.data) - self.capacity
        if excess > 0:
            del self.data[:excess]
            self.start += excess

    def read(self, offset: int, limit: int) -> tuple[int, bytes]:
        """Bytes from stream offset ``offset`` (clamped to what is still held); returns (actual offset, data)."""
        begin = max(offset, self.start)
        rel = begin - self.start
        return begin, bytes(self.data[rel : rel + limit])


class OutputQueue:
    """Foreground output on its way to one HTTP client, bounded by pausing the pipes (not by dropping)."""

    HIGH = 1 << 20
    LOW = 256 * 1024

    def __init__(self) -> None:
        self._items: deque[tuple[str, bytes]] = deque()
        self._bytes = 0
        self._event = asyncio.Event()
        self._paused = False
        self.pause: Callable[[bool], None] = lambda paused: None

    def put(self, stream: str, data: bytes) -> None:
        self._items.append((stream, data))
        self._bytes += len(data)
        self._event.set()
        if self._bytes > self.HIGH and not self._paused:
            self._paused = True
            self.pause(True)

    def wake(self) -> None:
        self._event.set()

    async def get(self, seconds: float) -> tuple[str, bytes] | None:
        """The next chunk, or ``None`` after ``seconds`` (or a :meth:`wake`) with nothing queued."""
        if not self._items:
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), seconds)
            if not self._items:
                return None
        stream, data = self._items.popleft()
        self._bytes -= len(data)
        if self._paused and self._bytes < self.LOW:
            self._paused = False
            self.pause(False)
        return stream, data


class _PipeReader(asyncio.Protocol):
    def __init__(self, command: Command, stream: str) -> None:
        self._command = command
        self._stream = stream
        self.transport: asyncio.ReadTransport | None = None
        self.eof = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._command.output(self._stream, data)

    def eof_received(self) -> bool | None:
        if not self.eof.done():
            self.eof.set_result(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.eof.done():
            self.eof.set_result(None)


class _PipeWriter(asyncio.Protocol):
    """stdin of a command, with flow control so a large stdin is not buffered whole."""

    def __init__(self) -> None:
        self.transport: asyncio.WriteTransport | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._can_write.set()

    async def write(self, data: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise BrokenPipeError("stdin is closed")
        self.transport.write(data)
        await self._can_write.wait()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class CommandStatus(TypedDict):
    """A command as ``GET /v1/commands[/{id}]`` shows it."""

    id: str
    argv: list[str]
    pid: int
    background: bool
    state: str  # running or exited
    exitCode: int | None
    signal: int | None  # the signal that ended it
    timedOut: bool
    startedAt: float
    endedAt: float | None


class Command:
    """One started process (its own session and process group) and its output."""

    def __init__(self, table: ProcessTable, cid: str, argv: list[str], kind: str, background: bool) -> None:
        self.table = table
        self.id = cid
        self.argv = argv
        self.kind = kind  # "command" | "workload" | "probe"
        self.background = background
        self.pid = 0
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.returncode: int | None = None  # os.waitstatus_to_exitcode(): negative = killed by that signal
        self.timed_out = False
        self.killed_by: int | None = None
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.done = asyncio.Event()  # exited and output drained
        self.stdout: RingBuffer | None = None
        self.stderr: RingBuffer | None = None
        self.queue: OutputQueue | None = None
        self.stdin: _PipeWriter | None = None
        self.stdin_ready = asyncio.Event()  # set once the pipes are connected to the loop
        self._readers: list[_PipeReader] = []
        self.popen: subprocess.Popen[bytes] | None = None
        self.pty_master: int | None = None  # a PTY's controlling side: output, input and resize go through it

    # Output routing: foreground commands stream through a bounded queue, background ones into ring buffers.
    def output(self, stream: str, data: bytes) -> None:
        if self.queue is not None:
            self.queue.put(stream, data)
        else:
            buf = self.stdout if stream == "stdout" else self.stderr
            if buf is not None:
                buf.append(data)

    def _pause_pipes(self, paused: bool) -> None:
        for reader in self._readers:
            if reader.transport is not None and not reader.transport.is_closing():
                if paused:
                    reader.transport.pause_reading()
                else:
                    reader.transport.resume_reading()

    @property
    def running(self) -> bool:
        return self.returncode is None

    @property
    def exit_code(self) -> int | None:
        """Shell convention: the exit status, or 128 + signal number when killed by a signal."""
        if self.returncode is None:
            return None
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    @property
    def term_signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    def kill(self, sig: int = signal.SIGKILL) -> bool:
        """Signal the whole process group (the command and everything it started). False if already gone."""
        if self.done.is_set():
            return False
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        if sig == signal.SIGKILL:
            self.killed_by = sig
        return True

    def status(self) -> CommandStatus:
        return {
            "id": self.id,
            "argv": self.argv,
            "pid": self.pid,
            "background": self.background,
            "state": "running" if self.running else "exited",
            "exitCode": self.exit_code,
            "signal": self.term_signal,
            "timedOut": self.timed_out,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
        }

    async def _supervise(self, limit: float | None) -> None:
        try:
            if limit is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(self.exited), limit)
                except TimeoutError:
                    self.timed_out = True
                    self.kill(signal.SIGKILL)
            await self.exited
            # Output written just before exit is still in the pipes; a grandchild holding them open must not
            # keep the command "running" forever, hence the bounded wait.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(r.eof for r in self._readers)), PIPE_DRAIN_AFTER_EXIT)
        finally:
            for reader in self._readers:
                if reader.transport is not None:
                    reader.transport.close()
            if self.stdin is not None:
                self.stdin.close()
            self.ended_at = time.time()
            self.done.set()
            if self.queue is not None:
                self.queue.wake()
            self.table._finished(self)


class ProcessTable:
    """All processes execd started, plus the reaper that also collects orphans (PID 1 duty)."""

    def __init__(self, *, ring_capacity: int = 1 << 20, keep_finished: int = 32) -> None:
        self.ring_capacity = ring_capacity
        self.keep_finished = keep_finished
        self.by_pid: dict[int, Command] = {}
        self.commands: dict[str, Command] = {}  # client-visible commands (not the workload or probes)
        self._finished_ids: deque[str] = deque()
        self.orphans_reaped = 0
        self.identity: Identity | None = None  # None: as execd (root)
        self.on_finished: list[Callable[[Command], None]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def install_reaper(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()  # children that exited before the handler existed

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            command = self.by_pid.pop(pid, None)
            if command is None:
                self.orphans_reaped += 1
                continue
            command.returncode = os.waitstatus_to_exitcode(status)
            if command.popen is not None:
                # Tell Popen the child is gone so it never waits on (or reports) a PID that may be reused.
                command.popen.returncode = command.returncode
            if not command.exited.done():
                command.exited.set_result(command.returncode)

    def spawn(
        self,
        argv: list[str],
        *,
        kind: str = "command",
        background: bool = False,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        capture: bool = True,
        stdin: bool = False,
        timeout: float | None = None,
        pty: tuple[int, int] | None = None,
        identity: Identity | None = None,
    ) -> Command:
        """Start ``argv`` in a new session. ``capture``: pipe stdout/stderr (else inherit execd's).
        ``identity``: the account to run as (default: the table's, i.e. execd's ``--user``, else root)."""
        ident = identity or self.identity
        if cwd is not None and not os.path.isdir(cwd):
            raise SpawnError("cwd", f"{cwd!r} is not an existing directory")
        cid = os.urandom(6).hex()
        command = Command(self, cid, argv, kind, background)
        slave: int | None = None
        if pty is not None:
            # ``pty``: (rows, cols). The child gets the slave as stdin/stdout/stderr and, as a session leader,
            # as its controlling terminal (job control, ^C, SIGWINCH); execd keeps the master.
            command.pty_master, slave = os.openpty()
            set_window_size(slave, *pty)
        popen: subprocess.Popen[bytes] | None = None
        try:
            popen = subprocess.Popen(
                argv,
                stdin=slave if slave is not None else subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=slave if slave is not None else subprocess.PIPE if capture else None,
                stderr=slave if slave is not None else subprocess.PIPE if capture else None,
                cwd=cwd,
                env=env,
                start_new_session=True,  # own process group: kill/timeout reach grandchildren too
                close_fds=True,
                preexec_fn=_controlling_terminal if slave is not None else None,
                user=ident.uid if ident is not None else None,
                group=ident.gid if ident is not None else None,
                extra_groups=list(ident.groups) if ident is not None else None,
            )
        except FileNotFoundError as exc:
            raise SpawnError("argv", f"executable not found: {exc.filename or argv[0]}") from None
        except PermissionError as exc:
            raise SpawnError("argv", f"permission denied: {exc.filename or argv[0]}") from None
        except OSError as exc:
            raise SpawnError("argv", f"cannot execute: {exc.strerror}") from None
        finally:
            if slave is not None:
                os.close(slave)  # the child holds it: the master reads EIO (end) once the last holder exits
                if popen is None and command.pty_master is not None:  # never started: nothing will read it
                    os.close(command.pty_master)
        assert popen is not None
        command.popen = popen
        command.pid = popen.pid
        self.by_pid[popen.pid] = command
        if kind == "command":
            self.commands[cid] = command
        if background:
            command.stdout = RingBuffer(self.ring_capacity)
            command.stderr = RingBuffer(self.ring_capacity)
        elif capture or pty is not None:
            command.queue = OutputQueue()
            command.queue.pause = command._pause_pipes
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._connect_and_supervise(command, popen, timeout))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return command

    async def _connect_and_supervise(
        self, command: Command, popen: subprocess.Popen[bytes], limit: float | None
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            if command.pty_master is not None:
                master = command.pty_master
                # Two file objects on one master: asyncio's pipe transports each own (and close) theirs.
                reading = os.fdopen(master, "rb", buffering=0)
                _, reader = await loop.connect_read_pipe(lambda: _PipeReader(command, "pty"), reading)
                command._readers.append(reader)
                writing = os.fdopen(os.dup(master), "wb", buffering=0)
                _, writer = await loop.connect_write_pipe(_PipeWriter, writing)
                command.stdin = writer
            for stream, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
                if pipe is not None:
                    _, reader = await loop.connect_read_pipe(lambda s=stream: _PipeReader(command, s), pipe)  # type: ignore[misc]
                    command._readers.append(reader)
            if popen.stdin is not None:
                _, writer = await loop.connect_write_pipe(_PipeWriter, popen.stdin)
                command.stdin = writer
        finally:
            command.stdin_ready.set()  # even on failure: a waiting stdin writer must see "no stdin", not hang
            await command._supervise(limit)

    def _finished(self, command: Command) -> None:
        if command.kind == "command":
            if command.background:
                self._finished_ids.append(command.id)
                # Bounded history: the oldest finished background records go first.
                while len(self._finished_ids) > self.keep_finished:
                    self.commands.pop(self._finished_ids.popleft(), None)
            else:
                self.commands.pop(command.id, None)
        for callback in self.on_finished:
            callback(command)

    def forget(self, cid: str) -> None:
        self.commands.pop(cid, None)
        with contextlib.suppress(ValueError):
            self._finished_ids.remove(cid)

    def live(self) -> list[Command]:
        return [c for c in self.by_pid.values() if c.running]

    async def wait_all_exited(self, seconds: float) -> bool:
        """Wait until every started process has exited (True) or ``seconds`` passed (False)."""
        pending = [c.exited for c in self.live()]
        if not pending:
            return True
        _, still = await asyncio.wait(pending, timeout=seconds)
        return not still

    def signal_all(self, sig: int) -> None:
        for command in self.live():
            command.kill(sig)
