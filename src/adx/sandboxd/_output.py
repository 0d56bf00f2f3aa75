"""The output pump: a sandbox's stdout and stderr as stream-tagged, timestamped, rotated log segments.

The supervisor starts one pump per sandbox before the sandbox's init exists. The init's descriptors 1 and 2
are the write ends of two FIFOs in the sandbox dir (``stdout.pipe``, ``stderr.pipe``; the init opens them by
path, so a prepared init that gets its spec later needs no descriptor passing); the pump holds the read ends.
Like the supervisor, the pump is no child of sandboxd: a sandboxd restart never closes a workload's output.

Each line becomes one JSON object (``{"time", "stream", "text"[, "partial"]}``) appended with a single write
to the group's current segment, ``<logs_dir>/<group>/<start_ns>-<sandbox_id>-<part>.jsonl``. The group is
the Environment (the node passes it at create), so the logs of every execution of an Environment — restarts,
restores — sit together in start order. A segment ends at ``segment_bytes``; then the oldest segments of the
group are removed until it holds at most ``max_bytes``. ``output.log`` in the sandbox dir keeps this
sandbox's raw bytes (capped the same way: emptied when full) for a person debugging sandboxd itself.

Stdlib only and no pathlib: the supervisor imports this in the spawner's pristine template.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import select
import time
from datetime import UTC, datetime
from typing import NotRequired, TypedDict

from adx.sandboxd._spawn_spec import SpawnSpec, read_to_eof

__all__ = ["PIPE_NAMES", "SEGMENT_SUFFIX", "finish_pump", "fork_pump", "make_fifos", "open_write_ends", "start_pump"]

PIPE_NAMES = ("stdout.pipe", "stderr.pipe")
STREAMS = ("stdout", "stderr")
SEGMENT_SUFFIX = ".jsonl"
RAW_LOG = "output.log"
#: A line longer than this is cut into pieces marked partial (a log line must fit one atomic append).
MAX_LINE = 16 << 10
#: Output without a newline is written (marked partial) once it waited this long: progress bars show up.
PARTIAL_FLUSH_SECONDS = 0.5
#: How long the supervisor waits for the pump to drain after the sandbox's init ended.
DRAIN_SECONDS = 2.0


def start_pump(spec: SpawnSpec) -> int | None:
    """Make the FIFOs and fork the pump (the caller's child). Returns its PID, or None when no pump could be
    started: then the init's output goes to ``/dev/null`` (its start does not fail for want of a log)."""
    reads = make_fifos(spec.sandbox_dir)
    return fork_pump(spec, reads) if reads is not None else None


def make_fifos(sdir: str) -> list[int] | None:
    """The FIFOs, their read ends open (a warm pool member's supervisor holds them until it is claimed, so the
    init's opens never wait; the pump is forked then, with the claiming sandbox's log group)."""
    reads: list[int] = []
    try:
        for name in PIPE_NAMES:
            path = f"{sdir}/{name}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.mkfifo(path, 0o600)
            # The read end first (non-blocking): then the writer's open never waits for a reader.
            reads.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        print(f"the output pump could not start (output is discarded): {exc}", flush=True)
        for fd in reads:
            os.close(fd)
        return None
    return reads


def fork_pump(spec: SpawnSpec, reads: list[int], claim_fd: int | None = None) -> int | None:
    """Fork the pump over ``reads`` (closed here either way). ``claim_fd``: a warm pool member's pump reads the
    claiming sandbox's spec there first (its log group and ID; EOF without one: the member was dropped, exit)."""
    try:
        gc.freeze()  # the pump's collections leave the supervisor's objects (and their shared pages) alone
        pid = os.fork()
    except OSError as exc:
        print(f"the output pump could not start (output is discarded): {exc}", flush=True)
        for fd in reads:
            os.close(fd)
        return None
    if pid == 0:
        code = 0
        try:
            # Keep only the read ends (and 0-2): a held copy of the supervisor's pipes (the prepared init's
            # spec or go pipe) would stall the init.
            high = fcntl.fcntl(claim_fd, fcntl.F_DUPFD_CLOEXEC, 64) if claim_fd is not None else -1
            keep = [os.dup2(fd, 10 + i, inheritable=False) for i, fd in enumerate(reads)]
            claim = os.dup2(high, 12, inheritable=False) if high >= 0 else -1
            os.closerange(3, 10)
            os.closerange(13 if claim >= 0 else 12, 65536)  # whatever else, the report pipe above all
            if claim >= 0:
                data = read_to_eof(claim)
                if not data:
                    os._exit(0)
                spec = SpawnSpec.from_json(data)
            Pump(spec, keep).run()
        except BaseException as exc:  # never return into the supervisor's code
            code = 1
            with contextlib.suppress(BaseException):
                print(f"output pump failed: {type(exc).__name__}: {exc}", flush=True)
        finally:
            os._exit(code)
    for fd in reads:
        os.close(fd)
    return pid


def open_write_ends(sdir: str, have_pump: bool) -> tuple[int, int]:
    """The init's stdout and stderr: the FIFOs' write ends (``/dev/null`` without a pump)."""
    flags = os.O_WRONLY | os.O_CLOEXEC
    if not have_pump:
        null = os.open("/dev/null", flags)
        return null, os.dup(null)
    return os.open(f"{sdir}/{PIPE_NAMES[0]}", flags), os.open(f"{sdir}/{PIPE_NAMES[1]}", flags)


def finish_pump(pid: int | None) -> None:
    """Wait (bounded) for the pump to write what the ended sandbox left in its pipes, so the output is complete
    when the exit is recorded."""
    if pid is None:
        return
    deadline = time.monotonic() + DRAIN_SECONDS
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.005)


class SegmentLine(TypedDict):
    """One line of a log segment as the pump writes it (JSON lines; ``_logs`` reads it back as a ``LogLine``)."""

    time: str  # RFC 3339, UTC, microseconds
    stream: str  # 'stdout' or 'stderr'
    text: str
    partial: NotRequired[bool]  # the line had no newline yet when flushed


class Segments:
    """The group's append-only segments: rotation at ``segment_bytes``, the group bounded by ``max_bytes``."""

    def __init__(self, spec: SpawnSpec) -> None:
        self.dir: str = spec.log_dir
        self.segment_bytes: int = spec.log_segment_bytes
        self.max_bytes: int = spec.log_max_bytes
        self.prefix = f"{time.time_ns():020d}-{spec.sandbox_id}-"
        self.part = 0
        self.fd = -1
        self.size = 0
        self._open()

    def _open(self) -> None:
        name = f"{self.prefix}{self.part:05d}{SEGMENT_SUFFIX}"
        os.makedirs(self.dir, mode=0o700, exist_ok=True)  # the group may have been removed meanwhile
        self.fd = os.open(f"{self.dir}/{name}", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.size = os.fstat(self.fd).st_size

    def append(self, data: bytes) -> None:
        if self.size and self.size + len(data) > self.segment_bytes:
            os.close(self.fd)
            self.part += 1
            self._open()
            self._prune()
        os.write(self.fd, data)
        self.size += len(data)

    def _prune(self) -> None:
        """Remove the group's oldest segments (of any execution) beyond ``max_bytes``; never the current one."""
        current = f"{self.prefix}{self.part:05d}{SEGMENT_SUFFIX}"
        entries = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(SEGMENT_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    entries.append((name, os.stat(f"{self.dir}/{name}").st_size))
        total = sum(size for _, size in entries)
        for name, size in entries:
            if total <= self.max_bytes or name == current:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.dir}/{name}")
            total -= size


class Pump:
    def __init__(self, spec: SpawnSpec, fds: list[int]) -> None:
        self.streams = dict(zip(fds, STREAMS, strict=True))
        self.pending: dict[int, tuple[bytes, float]] = {}
        self.segments = Segments(spec)
        self.raw = os.open(
            f"{spec.sandbox_dir}/{RAW_LOG}", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        self.raw_size = os.fstat(self.raw).st_size
        self.raw_max: int = spec.log_max_bytes
        self.supervisor = os.getppid()

    def run(self) -> None:
        poller = select.poll()
        for fd in self.streams:
            poller.register(fd, select.POLLIN)
        open_fds = set(self.streams)
        while open_fds:
            for fd, events in poller.poll(PARTIAL_FLUSH_SECONDS * 1000):
                if events & (select.POLLIN | select.POLLHUP | select.POLLERR) and not self._read(fd):
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    self._flush(fd)
            self._flush_stale()
            if os.getppid() != self.supervisor:
                # The supervisor is gone (it ended after the sandbox's init, or refused the start before the
                # init opened the pipes): nothing writes any more; keep what is buffered.
                for fd in list(open_fds):
                    while self._read(fd):
                        pass
                    self._flush(fd)
                break

    def _read(self, fd: int) -> bool:
        """Read what is there; False at end of stream (every writer closed)."""
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not data:
            return False
        self._raw(data)
        buffered, since = self.pending.pop(fd, (b"", time.monotonic()))
        buffered += data
        *lines, rest = buffered.split(b"\n")
        for line in lines:
            self._emit(fd, line, partial=False)
        while len(rest) > MAX_LINE:
            self._emit(fd, rest[:MAX_LINE], partial=True)
            rest = rest[MAX_LINE:]
        if rest:
            self.pending[fd] = (rest, since if not lines else time.monotonic())
        return True

    def _flush(self, fd: int) -> None:
        rest, _ = self.pending.pop(fd, (b"", 0.0))
        if rest:
            self._emit(fd, rest, partial=True)

    def _flush_stale(self) -> None:
        now = time.monotonic()
        for fd, (_, since) in list(self.pending.items()):
            if now - since >= PARTIAL_FLUSH_SECONDS:
                self._flush(fd)

    def _emit(self, fd: int, line: bytes, *, partial: bool) -> None:
        entry: SegmentLine = {
            "time": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "stream": self.streams[fd],
            "text": line.decode("utf-8", errors="replace"),
        }
        if partial:
            entry["partial"] = True
        try:
            self.segments.append((json.dumps(entry, ensure_ascii=False) + "\n").encode())
        except OSError as exc:  # a full disk loses lines, never the workload (its pipe keeps draining)
            print(f"output pump: writing a log line failed: {exc}", flush=True)

    def _raw(self, data: bytes) -> None:
        try:
            if self.raw_size + len(data) > self.raw_max:
                os.ftruncate(self.raw, 0)
                self.raw_size = 0
            os.write(self.raw, data)
            self.raw_size += len(data)
        except OSError:
            pass  # the raw copy is a convenience; the segments are the log
