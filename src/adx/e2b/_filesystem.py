"""envd's ``filesystem.Filesystem`` service on execd's files API (``/v1/files/stat|list|mkdir``, ``DELETE``).

``Move`` runs ``mv`` through execd's commands (execd has no rename); the watch RPCs are :mod:`adx.e2b._watch`.
"""

from __future__ import annotations

import json
import posixpath
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from adx.e2b._connect import RpcError, single_message
from adx.e2b._files import metadata_of
from adx.e2b._process import resolve
from adx.e2b._upstream import Execd, rpc_error_of
from adx.e2b._watch import WatchService, dispatch_watch

_TYPES = {"file": "FILE_TYPE_FILE", "directory": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}
_TYPE_BITS = {"file": stat.S_IFREG, "directory": stat.S_IFDIR, "symlink": stat.S_IFLNK}
MAX_DEPTH = 16


def timestamp(seconds: float) -> str:
    """google.protobuf.Timestamp in its JSON form (RFC 3339, UTC)."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{moment.microsecond:06d}Z"


def entry_info(path: str, described: dict[str, Any]) -> dict[str, Any]:
    """execd's ``{"name", "type", "size", "mode", "mtime"}`` as envd's EntryInfo (proto3 JSON)."""
    kind = str(described.get("type", "other"))
    mode = int(described.get("mode") or 0)
    entry: dict[str, Any] = {
        "name": described.get("name") or posixpath.basename(path),
        "type": _TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
        "path": path,
        "size": str(int(described.get("size") or 0)),  # int64: a string in proto3 JSON
        "mode": mode,
        "permissions": stat.filemode(_TYPE_BITS.get(kind, 0) | mode),
    }
    if described.get("mtime") is not None:
        entry["modifiedTime"] = timestamp(float(described["mtime"]))
    if metadata := metadata_of(described):
        entry["metadata"] = metadata
    if kind == "symlink":
        # As newer envd: ``type`` is what the link resolves to, ``isSymlink`` marks the link itself.
        entry["type"] = _TYPES.get(str(described.get("targetType")), "FILE_TYPE_SYMLINK")
        entry["isSymlink"] = True
        if described.get("target"):
            entry["symlinkTarget"] = str(described["target"])
    return entry


def _path(message: dict[str, Any], field: str, home: str) -> str:
    value = message.get(field)
    if not isinstance(value, str) or not value:
        raise RpcError("invalid_argument", f"{field}: required")
    return posixpath.normpath(resolve(value, home))


@dataclass
class FilesystemService:
    execd: Execd
    home: str

    async def dispatch(self, method: str, request: Request) -> Response:
        watch = WatchService(self.execd)
        if method in ("WatchDir", "CreateWatcher"):
            message = await single_message(request)
            path = _path(message, "path", self.home)
            if method == "WatchDir":
                return await watch.watch_dir(path, message)
            return await watch.create_watcher(path, message)
        watch_handler = dispatch_watch(watch, method)
        if watch_handler is not None:
            return cast(Response, await watch_handler(await single_message(request)))
        handler = {
            "Stat": self.stat,
            "ListDir": self.list_dir,
            "MakeDir": self.make_dir,
            "Remove": self.remove,
            "Move": self.move,
        }.get(method)
        if handler is None:
            raise RpcError("unimplemented", f"filesystem.Filesystem/{method} is not implemented")
        return await handler(await single_message(request))

    async def _stat(self, path: str) -> dict[str, Any]:
        status, body = await self.execd.call("GET", "/v1/files/stat", query={"path": path})
        if status != 200:
            raise rpc_error_of(status, body)
        return entry_info(path, json.loads(body))

    async def stat(self, message: dict[str, Any]) -> Response:
        return JSONResponse({"entry": await self._stat(_path(message, "path", self.home))})

    async def _list(self, path: str, depth: int, out: list[dict[str, Any]]) -> None:
        status, body = await self.execd.call("GET", "/v1/files/list", query={"path": path})
        if status != 200:
            raise rpc_error_of(status, body)
        for described in json.loads(body)["entries"]:
            child = posixpath.join(path, described["name"])
            out.append(entry_info(child, described))
            if depth > 1 and described.get("type") == "directory":
                await self._list(child, depth - 1, out)

    async def list_dir(self, message: dict[str, Any]) -> Response:
        path = _path(message, "path", self.home)
        depth = message.get("depth") or 1
        if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise RpcError("invalid_argument", f"depth: must be 1-{MAX_DEPTH}")
        entries: list[dict[str, Any]] = []
        await self._list(path, depth, entries)
        return JSONResponse({"entries": entries})

    async def make_dir(self, message: dict[str, Any]) -> Response:
        """Parents are made as needed; an existing path is ``already_exists`` (envd's answer)."""
        path = _path(message, "path", self.home)
        status, body = await self.execd.call("POST", "/v1/files/mkdir", query={"path": path})
        if status == 404:  # a missing parent: make the whole chain
            status, body = await self.execd.call("POST", "/v1/files/mkdir", query={"path": path, "parents": "true"})
        if status != 201:
            raise rpc_error_of(status, body, conflict="already_exists")
        now = datetime.now(UTC).timestamp()
        described = {"name": posixpath.basename(path), "type": "directory", "mode": 0o755, "mtime": now}
        return JSONResponse({"entry": entry_info(path, described)})

    async def remove(self, message: dict[str, Any]) -> Response:
        path = _path(message, "path", self.home)
        status, body = await self.execd.call("DELETE", "/v1/files", query={"path": path, "recursive": "true"})
        if status != 204 and status != 404:  # a missing path: nothing to remove, no error (as envd)
            raise rpc_error_of(status, body)
        return JSONResponse({})

    async def move(self, message: dict[str, Any]) -> Response:
        source = _path(message, "source", self.home)
        destination = _path(message, "destination", self.home)
        await self._stat(source)  # a missing source is not_found, as envd answers
        command = {"argv": ["mv", "-T", "--", source, destination], "encoding": "utf-8"}
        status, body = await self.execd.call("POST", "/v1/commands", json_body=command)
        if status != 200:
            raise rpc_error_of(status, body)
        frames = [json.loads(line) for line in body.splitlines() if line.strip()]
        end = frames[-1] if frames else {}
        if end.get("exitCode") != 0:
            errors = "".join(f.get("data", "") for f in frames if f.get("stream") == "stderr").strip()
            raise RpcError("failed_precondition", errors or f"mv {source} {destination} failed")
        return JSONResponse({"entry": await self._stat(destination)})
