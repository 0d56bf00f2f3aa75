"""Reading, listing and removing the workload logs the output pumps (``_output``) write.

``<state_dir>/logs/<group>/`` holds a group's segments (a group is an Environment: every execution of it);
they outlive their sandboxes, so a restarted or restored workload's output follows the earlier one's, until
the group is removed (the node does that per MET-5: when the Environment is gone). A reader's position is an
opaque cursor (segment name and offset): segments are append-only and never renamed, so a cursor stays valid
until rotation removes its segment; a reader past a removed segment continues at the next one and is told
(``truncated``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from adx.errors import InvalidInputError, NotFoundError
from adx.sandboxd._models import LOG_GROUP_PATTERN, WireModel
from adx.sandboxd._output import SEGMENT_SUFFIX

__all__ = [
    "LogGroupInfo",
    "LogGroupRequest",
    "LogGroups",
    "LogLine",
    "LogStore",
    "LogsRequest",
    "LogsResponse",
]

MAX_LINES = 10_000
#: How often a waiting reader looks for new output (a file's size; no inotify: segments come and go).
POLL_SECONDS = 0.1

GroupName = Annotated[str, Field(pattern=LOG_GROUP_PATTERN)]


class LogLine(WireModel):
    time: datetime = Field(description="when the pump read it (UTC)")
    stream: Literal["stdout", "stderr"]
    text: str = Field(description="without its newline; invalid UTF-8 replaced")
    partial: bool = Field(default=False, description="no newline ended it (cut at 16 KiB, idle 0.5 s, or the end)")
    execution: str = Field(description="the sandbox (the node's execution) that wrote it")


class LogsRequest(WireModel):
    group: GroupName
    cursor: str | None = Field(default=None, description="continue after what an earlier answer returned")
    tail: int | None = Field(default=None, ge=0, le=MAX_LINES, description="without cursor: only the last N lines")
    since: datetime | None = Field(default=None, description="only lines read at or after this time")
    limit: int = Field(default=1000, ge=1, le=MAX_LINES, description="at most this many lines per answer")
    wait_seconds: float = Field(default=0.0, ge=0, le=60, description="wait this long for a line when none is new")


class LogsResponse(WireModel):
    lines: list[LogLine]
    cursor: str = Field(description="pass it back to continue (empty: the group has no output yet)")
    truncated: bool = Field(default=False, description="rotation removed output between the cursor and these lines")


class LogGroupRequest(WireModel):
    group: GroupName


class LogGroupInfo(WireModel):
    group: str
    bytes: int
    updated_at: float


class LogGroups(WireModel):
    groups: list[LogGroupInfo]


def _since_key(since: datetime | None) -> str | None:
    """The pump's time format, so a string comparison orders like the instants."""
    if since is None:
        return None
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    return since.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _execution_of(segment: str) -> str:
    # <start_ns:20>-<sandbox_id>-<part:05>.jsonl
    return segment[21 : -len(SEGMENT_SUFFIX) - 6]


class LogStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def group_dir(self, group: str) -> Path:
        return self.root / group

    def _segments(self, group: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.group_dir(group)) if n.endswith(SEGMENT_SUFFIX))
        except FileNotFoundError:
            return []

    def read_now(self, req: LogsRequest) -> LogsResponse:
        segments = self._segments(req.group)
        truncated = False
        start, offset = 0, 0
        if req.cursor:
            name, _, off = req.cursor.rpartition(":")
            if not name.endswith(SEGMENT_SUFFIX) or not off.isdigit():
                raise InvalidInputError("cursor", "is not a cursor an earlier answer returned")
            if name in segments:
                start, offset = segments.index(name), int(off)
            else:
                # Rotation removed the cursor's segment: continue at the next kept one (output may be lost).
                start = next((i for i, s in enumerate(segments) if s > name), len(segments))
                truncated = start < len(segments)
        since = _since_key(req.since)
        keep: deque[LogLine] | list[LogLine] = deque(maxlen=req.tail) if req.tail is not None and not req.cursor else []
        limit = MAX_LINES * 100 if isinstance(keep, deque) else req.limit
        cursor = req.cursor or ""
        count = 0
        for index in range(start, len(segments)):
            name = segments[index]
            try:
                with open(self.group_dir(req.group) / name, "rb") as f:
                    f.seek(offset if index == start else 0)
                    position = f.tell()
                    data = f.read()
            except FileNotFoundError:  # rotated away meanwhile
                truncated = truncated or count > 0
                continue
            execution = _execution_of(name)
            cursor = f"{name}:{position}"
            for raw in data.split(b"\n")[:-1]:  # only complete lines: the last piece is being written
                position += len(raw) + 1
                cursor = f"{name}:{position}"
                try:
                    entry = json.loads(raw)
                except ValueError:
                    continue  # a torn line (a crash mid-write) is skipped, not fatal
                if since is not None and entry.get("time", "") < since:
                    continue
                keep.append(LogLine(execution=execution, **entry))
                count += 1
                if count >= limit:
                    return LogsResponse(lines=list(keep), cursor=cursor, truncated=truncated)
        return LogsResponse(lines=list(keep), cursor=cursor, truncated=truncated)

    async def read(self, req: LogsRequest) -> LogsResponse:
        """The lines after ``req.cursor`` (or the kept ones / the last ``tail``); with ``wait_seconds``, waits
        for a first new line that long."""
        deadline = time.monotonic() + req.wait_seconds
        while True:
            answer = await asyncio.to_thread(self.read_now, req)
            if answer.lines or time.monotonic() >= deadline:
                return answer
            if answer.cursor:  # later reads continue where this one ended
                req = req.model_copy(update={"cursor": answer.cursor, "tail": None})
            await asyncio.sleep(POLL_SECONDS)

    def _list_now(self) -> LogGroups:
        groups = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                    continue
                size, updated = 0, entry.stat().st_mtime
                for seg in os.scandir(entry.path):
                    with contextlib.suppress(FileNotFoundError):
                        st = seg.stat()
                        size += st.st_size
                        updated = max(updated, st.st_mtime)
                groups.append(LogGroupInfo(group=entry.name, bytes=size, updated_at=updated))
        return LogGroups(groups=sorted(groups, key=lambda g: g.group))

    async def list(self) -> LogGroups:
        return await asyncio.to_thread(self._list_now)

    def _delete_now(self, group: str) -> None:
        path = self.group_dir(group)
        if not path.is_dir():
            raise NotFoundError(f"log group {group} does not exist", details={"group": group})
        # Renamed first, so a half-removed group is never read (a pump still writing recreates its own dir).
        doomed = self.root / f".deleting-{group}-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    async def delete(self, req: LogGroupRequest) -> LogGroups:
        await asyncio.to_thread(self._delete_now, req.group)
        return await self.list()
