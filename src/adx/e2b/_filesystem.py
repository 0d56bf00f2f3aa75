"""envd's ``filesystem.Filesystem`` service on execd's files API (``/v1/files/stat|list|mkdir|rename``,
``DELETE``), every call as the account the SDK names (:mod:`adx.e2b._user`): relative paths are in its home and
what it creates is its own. The watch RPCs are :mod:`adx.e2b._watch`.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from adx.e2b._connect import single_message, timeout_seconds
from adx.e2b._entries import entry_info
from adx.e2b._messages import ListDirRequest, Message, MoveRequest, PathRequest, handler_of, message_as, path_of
from adx.e2b._upstream import Execd, rpc_error_of
from adx.e2b._watch import WatchService
from adx.model import FileList, FileStat, FileType


@dataclass
class FilesystemService:
    execd: Execd
    user: str

    def _query(self, path: str, **extra: str) -> dict[str, str]:
        return {"path": path, "user": self.user, **extra}

    async def dispatch(self, method: str, request: Request) -> Response:
        watch = WatchService(self.execd, self.user)
        if method == "WatchDir":  # the one stream: it ends at the call's deadline
            return await watch.watch_dir(await single_message(request), timeout_seconds(request))
        handler = handler_of(
            "filesystem.Filesystem",
            method,
            {
                "Stat": self.stat,
                "ListDir": self.list_dir,
                "MakeDir": self.make_dir,
                "Remove": self.remove,
                "Move": self.move,
                "CreateWatcher": watch.create_watcher,
                "GetWatcherEvents": watch.get_watcher_events,
                "RemoveWatcher": watch.remove_watcher,
            },
        )
        return await handler(await single_message(request))

    async def _stat(self, path: str) -> dict[str, object]:
        status, body = await self.execd.call("GET", "/v1/files/stat", query=self._query(path))
        if status != 200:
            raise rpc_error_of(status, body)
        described = FileStat.model_validate_json(body)
        return entry_info(described.path, described)

    async def stat(self, message: Message) -> Response:
        return JSONResponse({"entry": await self._stat(message_as(PathRequest, message).where())})

    async def _list(self, path: str, depth: int, out: list[dict[str, object]]) -> None:
        status, body = await self.execd.call("GET", "/v1/files/list", query=self._query(path))
        if status != 200:  # not a directory: envd's invalid argument (the SDK's InvalidArgumentException)
            raise rpc_error_of(status, body, conflict="invalid_argument")
        listed = FileList.model_validate_json(body)
        for described in listed.entries:
            child = posixpath.join(listed.path, described.name)
            out.append(entry_info(child, described))
            if depth > 1 and described.type is FileType.DIRECTORY:
                await self._list(child, depth - 1, out)

    async def list_dir(self, message: Message) -> Response:
        wanted = message_as(ListDirRequest, message)
        entries: list[dict[str, object]] = []
        await self._list(wanted.where(), wanted.depth or 1, entries)
        return JSONResponse({"entries": entries})

    async def make_dir(self, message: Message) -> Response:
        """Parents are made as needed; an existing path is ``already_exists`` (envd's answer)."""
        path = message_as(PathRequest, message).where()
        status, body = await self.execd.call("POST", "/v1/files/mkdir", query=self._query(path))
        if status == 404:  # a missing parent: make the whole chain
            query = self._query(path, parents="true")
            status, body = await self.execd.call("POST", "/v1/files/mkdir", query=query)
        if status != 201:
            raise rpc_error_of(status, body, conflict="already_exists")
        return JSONResponse({"entry": await self._stat(str(json.loads(body)["path"]))})

    async def remove(self, message: Message) -> Response:
        path = message_as(PathRequest, message).where(empty_is_home=False)
        query = self._query(path, recursive="true")
        status, body = await self.execd.call("DELETE", "/v1/files", query=query)
        if status != 204 and status != 404:  # a missing path: nothing to remove, no error (as envd)
            raise rpc_error_of(status, body)
        return JSONResponse({})

    async def move(self, message: Message) -> Response:
        """``rename(2)``, as envd's Move (a missing source is ``not_found``; missing parents of the destination
        are made, the user's)."""
        wanted = message_as(MoveRequest, message)
        source, destination = path_of(wanted.source, "source"), path_of(wanted.destination, "destination")
        query = self._query(source, to=destination)
        status, body = await self.execd.call("POST", "/v1/files/rename", query=query)
        if status != 200:
            raise rpc_error_of(status, body)
        return JSONResponse({"entry": await self._stat(str(json.loads(body)["path"]))})
