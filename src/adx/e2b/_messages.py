"""envd's Connect request messages (proto3 JSON, as the ``e2b`` SDK sends them) as typed objects.

Field names are envd's JSON names (``watcherId``); a field the SDK sends that is not read here is ignored, as
proto3 does with fields it does not know. A message of the wrong shape is Connect's ``invalid_argument``
naming the field and why. Rules that belong to the RPC (an empty path is the home, a PID that exists) stay
with the RPC.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic.alias_generators import to_camel

from adx.e2b._connect import RpcError
from adx.errors import InvalidInputError
from adx.model import parse_wire

__all__ = [
    "ConnectRequest",
    "ListDirRequest",
    "Message",
    "MoveRequest",
    "PathRequest",
    "ProcessInput",
    "ProcessSelector",
    "SendInputRequest",
    "SendSignalRequest",
    "StartRequest",
    "StreamInputMessage",
    "UpdateRequest",
    "WatchRequest",
    "WatcherRequest",
    "WindowSize",
    "handler_of",
    "message_as",
    "path_of",
]

M = TypeVar("M", bound=BaseModel)
#: A request message as decoded from JSON, before it is read as its type.
Message = Mapping[str, Any]
H = TypeVar("H")
#: ListDir's deepest walk (envd's ``depth``; 0, proto3's default, is 1).
MAX_DEPTH = 16


class _Message(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


def message_as(model: type[M], message: Message) -> M:
    """A decoded request message as ``model``; a wrong shape is ``invalid_argument`` naming the field."""
    try:
        return parse_wire(model, message)
    except InvalidInputError as exc:
        raise RpcError("invalid_argument", exc.message) from None


def handler_of(service: str, method: str, handlers: Mapping[str, H]) -> H:
    """The handler of ``service/method``; an RPC the table does not hold is Connect's ``unimplemented``."""
    handler = handlers.get(method)
    if handler is None:
        raise RpcError("unimplemented", f"{service}/{method} is not implemented")
    return handler


# filesystem.Filesystem


def path_of(value: str, field: str, *, empty_is_home: bool = True) -> str:
    """The path as given: absolute, or relative to the user's home (execd resolves it, ``~/`` too). An empty one
    (proto3 JSON omits it) is the home, as envd resolves it; except for ``Remove``, where it is refused rather
    than taken as 'remove the home'."""
    if not value:
        if not empty_is_home:
            raise RpcError("invalid_argument", f"{field}: required (an empty path would be the whole home)")
        return "~"
    return posixpath.normpath(value) if value.startswith("/") else value


class PathRequest(_Message):
    """``Stat``, ``MakeDir``, ``Remove``: one path (proto3 omits an empty one)."""

    path: StrictStr = ""

    def where(self, *, empty_is_home: bool = True) -> str:
        return path_of(self.path, "path", empty_is_home=empty_is_home)


class ListDirRequest(PathRequest):
    depth: Annotated[StrictInt, Field(ge=0, le=MAX_DEPTH)] = 0


class MoveRequest(_Message):
    source: StrictStr = ""
    destination: StrictStr = ""


class WatchRequest(PathRequest):
    """``WatchDir`` and ``CreateWatcher``."""

    recursive: StrictBool = False
    include_entry: StrictBool = False  # each create/write/chmod event carries its EntryInfo


class WatcherRequest(_Message):
    """``GetWatcherEvents`` and ``RemoveWatcher``: a watcher ``CreateWatcher`` answered (execd's ID)."""

    watcher_id: Annotated[StrictStr, Field(min_length=1, pattern=r"^[^/]*$")]


# process.Process


class ProcessConfig(_Message):
    cmd: Annotated[StrictStr, Field(min_length=1)]
    args: list[StrictStr] = Field(default_factory=list)
    envs: dict[str, StrictStr] = Field(default_factory=dict)
    cwd: StrictStr | None = None


class WindowSize(_Message):
    """A terminal's size: the kernel's unsigned shorts."""

    rows: Annotated[StrictInt, Field(ge=1, le=65535)]
    cols: Annotated[StrictInt, Field(ge=1, le=65535)]


class Pty(_Message):
    size: WindowSize


class StartRequest(_Message):
    process: ProcessConfig
    pty: Pty | None = None
    tag: StrictStr | None = None  # names the process for List and ProcessSelector (envd's start command's)
    stdin: StrictBool | None = None  # the SDK asks for stdin kept open (``commands.run(..., stdin=True)``)


class ProcessSelector(_Message):
    """Which process: by PID, or by the tag its Start gave it."""

    pid: StrictInt | None = None
    tag: StrictStr | None = None


class ConnectRequest(_Message):
    """``Connect``, ``CloseStdin``: one process."""

    process: ProcessSelector = Field(default_factory=ProcessSelector)


def _signal(value: object) -> object:
    # Checked as one field: a failed union would name its branches (``signal.str``), not the field.
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"must be a signal's name (SIGNAL_SIGKILL) or number, got {value!r}")
    return value


class SendSignalRequest(ConnectRequest):
    signal: Annotated[str | int, BeforeValidator(_signal)] = "SIGNAL_UNSPECIFIED"


class ProcessInput(_Message):
    """Bytes for the process, base64: ``stdin`` for its pipe or ``pty`` for its terminal."""

    stdin: StrictStr | None = None
    pty: StrictStr | None = None


class SendInputRequest(ConnectRequest):
    input: ProcessInput | None = None


class UpdateRequest(ConnectRequest):
    pty: Pty | None = None


class _StreamStart(_Message):
    process: ProcessSelector = Field(default_factory=ProcessSelector)


class _StreamData(_Message):
    input: ProcessInput | None = None


class StreamInputMessage(_Message):
    """One message of ``StreamInput``: its ``start`` (which process), then ``data``; a keepalive has neither."""

    start: _StreamStart | None = None
    data: _StreamData | None = None
