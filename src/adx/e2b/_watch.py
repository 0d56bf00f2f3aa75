"""envd's watch RPCs (``WatchDir`` stream; ``CreateWatcher`` / ``GetWatcherEvents`` / ``RemoveWatcher`` polling)
on execd's inotify watchers (``/v1/watchers``, :mod:`adx.execd._watch`).

``WatchDir`` is a watcher of its own, long-polled while the stream lasts and removed when it ends (the client
left, or its deadline passed), so a stream never leaves a watcher behind in the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.responses import JSONResponse, Response, StreamingResponse

from adx.e2b._connect import STREAM_TYPE, RpcError, end_stream, envelope
from adx.e2b._entries import entry_info
from adx.e2b._messages import Message, WatcherRequest, WatchRequest, message_as
from adx.e2b._upstream import Execd, rpc_error_of
from adx.model import FileStat

_TYPES = {
    "create": "EVENT_TYPE_CREATE",
    "write": "EVENT_TYPE_WRITE",
    "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME",
    "chmod": "EVENT_TYPE_CHMOD",
}
#: How long one long-poll of a ``WatchDir`` stream waits in execd for an event (a keepalive follows an empty one).
POLL_WAIT_SECONDS = 5.0
# Removals of the watchers of streams that ended, kept referenced until done.
_CLEANUPS: set[asyncio.Task[None]] = set()


#: execd's write goes through a temporary file renamed onto the name (atomic, :mod:`adx.execd._files`).
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.execd-tmp\.[0-9a-f]{8}$")


class _Events:
    """execd's events as envd's. envd writes a file in place, so its watchers see the file itself created and
    written; a write through execd shows in inotify as a temporary file created, written and renamed onto the
    name. The temporary file's events are dropped and its arrival under the name (``create``) is followed by a
    ``write`` of it. One per stream: a rename's two halves may come in consecutive polls."""

    def __init__(self) -> None:
        self._arriving: set[str] = set()

    def translate(self, body: bytes) -> list[dict[str, object]]:
        out = []
        for event in json.loads(body)["events"]:
            name, kind = str(event["name"]), str(event["type"])
            folder, base = posixpath.split(name)
            temporary = _TEMPORARY.match(base)
            if temporary:
                if kind == "rename":
                    self._arriving.add(posixpath.join(folder, temporary["name"]))
                continue
            translated: dict[str, object] = {"name": name, "type": _TYPES[kind]}
            if "entry" in event:  # asked for (include_entry) and still there when execd read the event
                described = FileStat.model_validate(event["entry"])
                translated["entry"] = entry_info(described.path, described)
            out.append(translated)
            if kind == "create" and name in self._arriving:
                self._arriving.discard(name)
                out.append({**translated, "type": _TYPES["write"]})
        return out


@dataclass
class WatchService:
    execd: Execd
    user: str  # a relative path is in this account's home

    async def _create(self, message: Message) -> str:
        wanted = message_as(WatchRequest, message)
        watch = {
            "path": wanted.where(),
            "recursive": wanted.recursive,
            "user": self.user,
            "entries": wanted.include_entry,
        }
        status, body = await self.execd.call("POST", "/v1/watchers", json_body=watch)
        if status != 201:
            raise rpc_error_of(status, body)
        return str(json.loads(body)["id"])

    async def _take(self, watcher_id: str, wait: float, events: _Events) -> list[dict[str, object]]:
        status, body = await self.execd.call("GET", f"/v1/watchers/{watcher_id}/events", query={"wait": str(wait)})
        if status != 200:
            raise rpc_error_of(status, body, conflict="data_loss")
        return events.translate(body)

    async def _remove(self, watcher_id: str) -> None:
        status, body = await self.execd.call("DELETE", f"/v1/watchers/{watcher_id}")
        if status != 204:
            raise rpc_error_of(status, body)

    async def create_watcher(self, message: Message) -> Response:
        return JSONResponse({"watcherId": await self._create(message)})

    async def get_watcher_events(self, message: Message) -> Response:
        watcher_id = message_as(WatcherRequest, message).watcher_id
        return JSONResponse({"events": await self._take(watcher_id, 0, _Events())})

    async def remove_watcher(self, message: Message) -> Response:
        await self._remove(message_as(WatcherRequest, message).watcher_id)
        return JSONResponse({})

    async def watch_dir(self, message: Message, deadline: float | None) -> Response:
        """``deadline``: the call's (``Connect-Timeout-Ms``, the SDK's ``timeout``); the stream ends at it with
        Connect's ``deadline_exceeded``, as envd's does, so the SDK's ``on_exit`` gets its TimeoutException."""
        watcher_id = await self._create(message)  # a missing path fails here, before the stream starts
        ends = None if deadline is None else time.monotonic() + deadline
        return StreamingResponse(self._stream(watcher_id, ends), media_type=STREAM_TYPE)

    async def _stream(self, watcher_id: str, ends: float | None) -> AsyncIterator[bytes]:
        translation = _Events()
        try:
            yield envelope({"start": {}})
            while True:
                left = POLL_WAIT_SECONDS if ends is None else ends - time.monotonic()
                if left <= 0:
                    yield end_stream(RpcError("deadline_exceeded", "context deadline exceeded"))
                    return
                try:
                    events = await self._take(watcher_id, min(left, POLL_WAIT_SECONDS), translation)
                except RpcError as exc:
                    yield end_stream(exc)
                    return
                for event in events:
                    yield envelope({"filesystem": event})
                if not events:
                    yield envelope({"keepalive": {}})
        finally:
            # The generator may be closed by cancellation: the removal runs on its own task.
            task = asyncio.get_running_loop().create_task(self._remove_quietly(watcher_id))
            _CLEANUPS.add(task)
            task.add_done_callback(_CLEANUPS.discard)

    async def _remove_quietly(self, watcher_id: str) -> None:
        try:
            await self._remove(watcher_id)
        except Exception:  # the sandbox went away: so did its watchers
            return
