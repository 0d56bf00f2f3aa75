"""What both embedded servers share: identity of a running server, reuse, start, stop, crash detection."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from adx._fs import atomic_write_json, exclusive_lock
from adx.errors import UnavailableError

log = logging.getLogger("adx.embedded")

# sun_path is 108 bytes on Linux including the terminating NUL.
MAX_UNIX_SOCKET_PATH = 107


class ServerState(StrEnum):
    RUNNING = "running"  # process alive and answering its health check
    UNHEALTHY = "unhealthy"  # process alive but not answering
    CRASHED = "crashed"  # a recorded process is gone without a clean stop
    STOPPED = "stopped"  # cleanly stopped or never started


@dataclass(frozen=True)
class ServerInfo:
    """The recorded identity of a running embedded server (``server.json``)."""

    kind: str
    pid: int
    # Kernel start time of the process (clock ticks since boot): a recycled PID never matches it.
    proc_start_ticks: int
    boot_id: str
    host: str
    port: int
    unix_socket: str | None
    url: str
    started_at: float


@dataclass(frozen=True)
class ServerStatus:
    kind: str
    state: ServerState
    info: ServerInfo | None
    detail: str = ""


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` from /proc, or None if there is no such (non-zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


#: How long a crash restart waits for the previous port to be released before choosing another.
PREVIOUS_PORT_GRACE_SECONDS = 1.0


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def pick_free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class PortInUse(Exception):
    """Internal: the server failed to bind its port (mapped to UnavailableError at the boundary)."""


class ServerSettings(Protocol):
    """The part of a server's configuration section (``RedisServerConfig``, ``PostgresServerConfig``) that says
    where it listens and how long it may take to start and to stop."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def start_timeout_seconds(self) -> float: ...

    @property
    def stop_timeout_seconds(self) -> float: ...


def listen_and_timeouts(settings: ServerSettings) -> tuple[str, int, float, float]:
    """``settings`` as :class:`ManagedServer`'s host, port, start and stop timeout arguments."""
    return settings.host, settings.port, settings.start_timeout_seconds, settings.stop_timeout_seconds


class ManagedServer:
    """A server process owned through a state directory, not through a Python object.

    Any process can ``start()`` on the same directory: if the recorded server is alive and healthy it is
    reused, otherwise a new one starts on the existing data. Start and stop are serialised by a lock file.
    """

    kind: str = "server"
    log_name: str = "server.log"
    #: False for daemons that listen only on Unix sockets: no port is chosen or checked.
    listens_on_tcp: bool = True

    def __init__(self, state_dir: Path, host: str, port: int, start_timeout: float, stop_timeout: float) -> None:
        self.dir = Path(state_dir).absolute() / self.kind
        self.host = host
        self.requested_port = port
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.info_path = self.dir / "server.json"
        self.lock_path = self.dir / "server.lock"
        self.log_path = self.dir / self.log_name
        self._child: subprocess.Popen[bytes] | None = None
        self.reused = False

    # -- to implement per server ------------------------------------------------------------------
    def _prepare(self) -> None:
        """Create on-disk data if missing (idempotent, crash-safe)."""

    def _command(self, port: int, unix_socket: str | None) -> list[str]:
        raise NotImplementedError

    def _unix_socket_path(self, port: int) -> str | None:
        return None

    def _url(self, port: int) -> str:
        raise NotImplementedError

    def _probe(self, url: str, unix_socket: str | None, timeout: float) -> str | None:
        """Return None when healthy, else a short reason."""
        raise NotImplementedError

    def _after_first_healthy(self, url: str) -> None:
        """Post-start setup (e.g. create the application database)."""

    def _stop_signal(self) -> int:
        return signal.SIGTERM

    def _bind_failure(self, log_tail: str) -> bool:
        return "Address already in use" in log_tail

    # -- public -----------------------------------------------------------------------------------
    def read_info(self) -> ServerInfo | None:
        try:
            raw = json.loads(self.info_path.read_text())
            return ServerInfo(**raw)
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            log.warning("ignoring unreadable %s: %s", self.info_path, exc)
            return None

    def is_alive(self, info: ServerInfo) -> bool:
        if self._child is not None and self._child.pid == info.pid and self._child.poll() is not None:
            return False
        return info.boot_id == boot_id() and proc_start_ticks(info.pid) == info.proc_start_ticks

    def status(self) -> ServerStatus:
        info = self.read_info()
        if info is None:
            return ServerStatus(self.kind, ServerState.STOPPED, None)
        if not self.is_alive(info):
            return ServerStatus(self.kind, ServerState.CRASHED, info, self._crash_detail(info))
        reason = self._probe(info.url, info.unix_socket, timeout=2.0)
        if reason is not None:
            return ServerStatus(self.kind, ServerState.UNHEALTHY, info, reason)
        return ServerStatus(self.kind, ServerState.RUNNING, info)

    def start(self) -> ServerInfo:
        """Start (or reuse) the server; return where it listens. Raises UnavailableError on failure."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with exclusive_lock(self.lock_path, timeout=self.start_timeout + self.stop_timeout, what=f"{self.kind} lock"):
            info = self.read_info()
            if info is not None and self.is_alive(info):
                deadline = time.monotonic() + self.start_timeout
                reason = self._wait_healthy(info.url, info.unix_socket, deadline, None)
                if reason is None:
                    self.reused = True
                    log.info("reusing running %s", self.kind, extra={"pid": info.pid, "url": info.url})
                    return info
                raise UnavailableError(
                    f"{self.kind} server pid {info.pid} from {self.dir} is running but unhealthy: {reason}"
                )
            if info is not None:
                log.warning(
                    "%s server pid %d is gone without a clean stop; restarting on the existing data",
                    self.kind,
                    info.pid,
                    extra={"detail": self._crash_detail(info)},
                )
            self._prepare()
            return self._start_locked(info.port if info is not None else None)

    def stop(self) -> bool:
        """Stop the recorded server if running. Returns True if a process was stopped."""
        if not self.dir.exists():
            return False
        with exclusive_lock(self.lock_path, timeout=self.start_timeout + self.stop_timeout, what=f"{self.kind} lock"):
            info = self.read_info()
            stopped = False
            if info is not None and self.is_alive(info):
                self._terminate(info.pid)
                stopped = True
            with contextlib.suppress(FileNotFoundError):
                self.info_path.unlink()
            return stopped

    def send_signal(self, sig: int) -> int:
        """Signal the recorded server process (tests use SIGKILL). Returns the pid signalled."""
        info = self.read_info()
        if info is None or not self.is_alive(info):
            raise UnavailableError(f"{self.kind} server is not running")
        os.kill(info.pid, sig)
        return info.pid

    def wait_exited(self, timeout: float = 10.0) -> None:
        info = self.read_info()
        if info is None:
            return
        deadline = time.monotonic() + timeout
        while self.is_alive(info):
            if time.monotonic() > deadline:
                raise UnavailableError(f"{self.kind} server pid {info.pid} did not exit within {timeout}s")
            time.sleep(0.01)

    # -- internals --------------------------------------------------------------------------------
    def _crash_detail(self, info: ServerInfo) -> str:
        return f"pid {info.pid} exited; last log lines:\n{tail(self.log_path)}"

    def _start_locked(self, previous_port: int | None) -> ServerInfo:
        if not self.listens_on_tcp:
            return self._spawn(0)
        attempts = 1 if self.requested_port else 3
        for attempt in range(1, attempts + 1):
            if not self.requested_port and previous_port and attempt == 1 and self._previous_port_frees(previous_port):
                # A restart keeps its address when it can, so clients holding the old URL reconnect.
                port = previous_port
            elif self.requested_port:
                port = self.requested_port
                if not port_is_free(self.host, port):
                    raise UnavailableError(
                        f"{self.kind}: port {port} on {self.host} is already in use; choose another port "
                        f"or 0 for a free one"
                    )
            else:
                port = pick_free_port(self.host)
            try:
                return self._spawn(port)
            except PortInUse:
                if attempt == attempts:
                    raise UnavailableError(f"{self.kind}: port {port} on {self.host} is already in use") from None
                log.info("%s: port %d was taken meanwhile; trying another", self.kind, port)
        raise AssertionError("unreachable")

    def _previous_port_frees(self, port: int) -> bool:
        # A SIGKILLed server's listening socket is released by the kernel some milliseconds after the
        # process is gone (measured: ~20 ms), so a crash restart gives the old port a moment first.
        deadline = time.monotonic() + PREVIOUS_PORT_GRACE_SECONDS
        while not port_is_free(self.host, port):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _spawn(self, port: int) -> ServerInfo:
        unix_socket = self._unix_socket_path(port)
        cmd = self._command(port, unix_socket)
        with open(self.log_path, "ab") as logfile:
            logfile.write(f"--- adx: starting {self.kind} on {self.host}:{port} at {time.ctime()}\n".encode())
            logfile.flush()
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    cwd=self.dir,
                    # Own session: a Ctrl-C in the terminal reaches `adx up`, which stops servers in order.
                    start_new_session=True,
                    close_fds=True,
                )
            except FileNotFoundError as exc:
                raise UnavailableError(f"{self.kind}: cannot execute {exc.filename}: not found") from None
            except PermissionError as exc:
                raise UnavailableError(f"{self.kind}: cannot execute {exc.filename}: permission denied") from None
        self._child = proc
        url = self._url(port)
        deadline = time.monotonic() + self.start_timeout
        reason = self._wait_healthy(url, unix_socket, deadline, proc)
        if reason is not None:
            log_tail = tail(self.log_path)
            if proc.poll() is None:
                self._terminate(proc.pid)
            if self._bind_failure(log_tail):
                raise PortInUse()
            raise UnavailableError(f"{self.kind} did not become healthy: {reason}; log {self.log_path}:\n{log_tail}")
        ticks = proc_start_ticks(proc.pid)
        assert ticks is not None
        info = ServerInfo(
            kind=self.kind,
            pid=proc.pid,
            proc_start_ticks=ticks,
            boot_id=boot_id(),
            host=self.host,
            port=port,
            unix_socket=unix_socket,
            url=url,
            started_at=time.time(),
        )
        try:
            self._after_first_healthy(url)
        except BaseException:
            self._terminate(proc.pid)  # a server refused after its start is not left running unrecorded
            raise
        atomic_write_json(self.info_path, asdict(info))
        log.info("%s started", self.kind, extra={"pid": proc.pid, "url": url})
        return info

    def _wait_healthy(
        self, url: str, unix_socket: str | None, deadline: float, proc: subprocess.Popen[bytes] | None
    ) -> str | None:
        reason: str | None = "not probed"
        while True:
            if proc is not None and proc.poll() is not None:
                return f"process exited with status {proc.returncode}"
            reason = self._probe(url, unix_socket, timeout=1.0)
            if reason is None:
                return None
            if time.monotonic() >= deadline:
                return f"timed out: {reason}"
            time.sleep(0.02)

    def _terminate(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, self._stop_signal())
        deadline = time.monotonic() + self.stop_timeout
        ticks = proc_start_ticks(pid)
        while ticks is not None and proc_start_ticks(pid) == ticks:
            if self._child is not None and self._child.pid == pid and self._child.poll() is not None:
                break
            if time.monotonic() > deadline:
                log.warning("%s pid %d ignored the stop signal for %.0fs; killing", self.kind, pid, self.stop_timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + self.stop_timeout
            time.sleep(0.01)
        if self._child is not None and self._child.pid == pid:
            self._child.wait()
            self._child = None
