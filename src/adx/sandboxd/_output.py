"""The output pump: a sandbox's stdout and stderr as stream-tagged, timestamped, rotated log segments.

The pump is the sandbox's supervisor itself, once the sandbox started: it reads the output while it waits for
the init to end (:meth:`Pump.run` polls the FIFOs and the init's pidfd). The init's descriptors 1 and 2 are
the write ends of two FIFOs in the sandbox dir (``stdout.pipe``, ``stderr.pipe``; the init opens them by path,
so a prepared init that gets its spec later needs no descriptor passing); the supervisor makes them, and holds
the read ends, before the init exists. The supervisor is no child of sandboxd: a sandboxd restart never
closes a workload's output. (The pump used to be a process of its own, forked by the supervisor: ~2 MiB PSS
per sandbox, most of it the supervisor's heap copied again; issue 16.)

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
import json
import os
import select
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NotRequired, TypedDict

from adx.sandboxd._spawn_spec import SpawnSpec

__all__ = ["PIPE_NAMES", "SEGMENT_SUFFIX", "Pump", "make_fifos", "open_write_ends"]

PIPE_NAMES = ("stdout.pipe", "stderr.pipe")
STREAMS = ("stdout", "stderr")
SEGMENT_SUFFIX = ".jsonl"
RAW_LOG = "output.log"
#: A line longer than this is cut into pieces marked partial (a log line must fit one atomic append).
MAX_LINE = 16 << 10
#: Output without a newline is written (marked partial) once it waited this long: progress bars show up.
PARTIAL_FLUSH_SECONDS = 0.5
#: How long the pump keeps draining the pipes after the sandbox's init ended (its last writers are going).
DRAIN_SECONDS = 2.0


def make_fifos(sdir: str) -> list[int] | None:
    """The FIFOs, their read ends open (the supervisor holds them from before the init exists: the init's opens
    never wait, and what it writes before the pump runs waits in the pipes). None when they could not be made:
    then the init's output goes to ``/dev/null`` (its start does not fail for want of a log)."""
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


def open_write_ends(sdir: str, have_pump: bool) -> tuple[int, int]:
    """The init's stdout and stderr: the FIFOs' write ends (``/dev/null`` without a pump)."""
    flags = os.O_WRONLY | os.O_CLOEXEC
    if not have_pump:
        null = os.open("/dev/null", flags)
        return null, os.dup(null)
    return os.open(f"{sdir}/{PIPE_NAMES[0]}", flags), os.open(f"{sdir}/{PIPE_NAMES[1]}", flags)


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
    """The sandbox's output, pumped by its supervisor while it waits for the init (:meth:`run`)."""

    def __init__(self, spec: SpawnSpec, fds: list[int]) -> None:
        """OSError when the log group's segment or ``output.log`` cannot be opened."""
        self.streams = dict(zip(fds, STREAMS, strict=True))
        self.pending: dict[int, tuple[bytes, float]] = {}
        self.segments = Segments(spec)
        self.raw = os.open(
            f"{spec.sandbox_dir}/{RAW_LOG}", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        self.raw_size = os.fstat(self.raw).st_size
        self.raw_max: int = spec.log_max_bytes

    def run(self, init_fd: int, timer: tuple[float, Callable[[], None]] | None = None) -> None:
        """Pump until the init has ended (``init_fd``, its pidfd, readable) and what it and its last writers
        left is read: EOF on both FIFOs, at most ``DRAIN_SECONDS`` after the end. ``timer``: ``(deadline,
        call)``, ``call`` run once at the ``time.monotonic()`` deadline or at the init's end, whichever is
        first. The poll sleeps without a timeout when nothing is due: an idle sandbox costs no wake-ups."""
        poller = select.poll()
        for fd in self.streams:
            poller.register(fd, select.POLLIN)
        poller.register(init_fd, select.POLLIN)
        open_fds = set(self.streams)
        drain_until: float | None = None  # set once the init ended
        while open_fds or drain_until is None:
            now = time.monotonic()
            due = [since + PARTIAL_FLUSH_SECONDS for _, since in self.pending.values()]
            due += [t for t in (drain_until, timer[0] if timer else None) if t is not None]
            wait_ms = max(0.0, min(due) - now) * 1000 if due else None
            for fd, events in poller.poll(wait_ms):
                if fd == init_fd:
                    poller.unregister(init_fd)
                    drain_until = time.monotonic() + DRAIN_SECONDS
                elif events & (select.POLLIN | select.POLLHUP | select.POLLERR) and not self._read(fd):
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    self._flush(fd)
            self._flush_stale()
            now = time.monotonic()
            if timer is not None and (now >= timer[0] or drain_until is not None):
                call, timer = timer[1], None
                call()
            if drain_until is not None and now >= drain_until:
                break  # a writer outlived the init (held by something outside the sandbox?): keep what came
        for fd in open_fds:
            self._flush(fd)

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
