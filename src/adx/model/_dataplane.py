"""The data plane's wire shapes (commands and files): what execd reads and answers, as the Ingress publishes them.

execd itself stays on the standard library (every import costs every sandbox), so it validates by hand
(``adx.execd._daemon``, ``adx.execd._files``); these models state the same rules for the OpenAPI document and for
clients. Each bound here is one execd enforces: a request these schemas allow is never refused for its shape.
"""

from __future__ import annotations

import signal
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue, Strict
from pydantic.config import JsonDict

from adx.model._base import INTEGRAL, ApiModel

#: The header in which the Ingress tells the Relay what Host a client asked for; the Relay gives it to a service in
#: the sandbox as its Host (a ``get_host(port)`` name, as E2B's proxy passes the sandbox host name on).
FORWARDED_HOST_HEADER = "x-forwarded-host"
#: execd's longest command timeout (``MAX_TIMEOUT``): seven days.
MAX_COMMAND_TIMEOUT_SECONDS = 7 * 86_400.0
#: No NUL anywhere: the kernel takes none inside an argument, a path, a variable or an account name.
NO_NUL = r"^[^\x00]*$"
#: Strict base64 (padded), what ``binascii.a2b_base64`` decodes without an error.
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
#: A command's ID as execd makes it (``os.urandom(6).hex()``).
COMMAND_ID = r"^[0-9a-f]{12}$"
#: An account of the sandbox's /etc/passwd, by name or numeric uid (which ones exist is the sandbox's data).
ACCOUNT = r"^[^\x00:\n]+$"

Text = Annotated[str, Field(pattern=NO_NUL)]
#: Signals by name (aliases too) or number: what ``signal.Signals`` takes.
SIGNAL_NAMES = tuple(signal.Signals.__members__)
SIGNAL_NUMBERS = tuple(sorted({s.value for s in signal.Signals}))
# Between fields, what execd's _parse_run enforces (a key given as null counts as given where execd says so).
_ONE_PROGRAM: list[JsonValue] = [
    {"required": ["argv"], "properties": {"argv": {"type": "array"}, "command": {"type": "null"}}},
    {"required": ["command"], "properties": {"command": {"type": "string"}, "argv": {"type": "null"}}},
]
_TWO_STDINS: JsonDict = {"required": ["stdin", "stdinBase64"]}
_PTY_IN_BACKGROUND: JsonDict = {
    "required": ["pty", "background"],
    "properties": {"pty": {"type": "object"}, "background": {"const": True}},
}
WindowSide = Annotated[int, Strict(), Field(ge=1, le=65535), INTEGRAL]


class Encoding(StrEnum):
    UTF8 = "utf-8"  # decoded text; undecodable bytes become U+FFFD
    BASE64 = "base64"  # the exact bytes


class WindowSize(ApiModel):
    """A terminal's size: the kernel's unsigned shorts."""

    rows: WindowSide
    cols: WindowSide


class RunCommand(ApiModel):
    """``POST .../commands``: exactly one of ``argv`` and ``command``."""

    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra={
            "oneOf": _ONE_PROGRAM,
            "not": {"anyOf": [_TWO_STDINS, _PTY_IN_BACKGROUND]},
        }
    )

    argv: list[Text] | None = Field(default=None, min_length=1, description="the program and its arguments")
    command: Annotated[str, Field(pattern=r"^[^\x00]*\S[^\x00]*$")] | None = Field(
        default=None, description="a shell command line, run by /bin/sh -c"
    )
    env: dict[str, Text] = Field(
        default_factory=dict,
        description="added to the sandbox's environment",
        json_schema_extra={"propertyNames": {"pattern": r"^[^=\x00]+$"}},
    )
    cwd: Annotated[str, Field(pattern=r"^/[^\x00]*$")] | None = Field(
        default=None, description="an existing directory (absolute); default: the sandbox's, or the user's home"
    )
    timeout_seconds: (
        Annotated[float, Strict(), Field(gt=0, le=MAX_COMMAND_TIMEOUT_SECONDS, allow_inf_nan=False)] | None
    ) = Field(default=None, description="killed (SIGKILL) after this long; timedOut says so")
    # Not nullable: execd refuses a null stdin (a key given is a stdin given).
    stdin: str = Field(default="", description="written to its stdin, which is then closed")
    stdin_base64: Annotated[str, Field(pattern=BASE64)] = Field(default="", description="the same, as bytes")
    keep_stdin_open: bool = Field(default=False, description="stdin stays open for POST .../stdin")
    background: bool = Field(default=False, description="answer 201 with its status at once; output is kept")
    encoding: Encoding = Field(default=Encoding.UTF8, description="of the data of output frames")
    pty: WindowSize | None = Field(default=None, description="run on a terminal of this size (not with background)")
    user: Annotated[str, Field(pattern=ACCOUNT)] | None = Field(
        default=None, description="run as this account of the sandbox, in its home"
    )


class CommandStarted(ApiModel):
    """The first NDJSON frame of a foreground command."""

    id: str
    pid: int


class OutputFrame(ApiModel):
    """Output as produced (utf-8 text, or base64 with ``encoding: base64``)."""

    stream: Literal["stdout", "stderr", "pty"]
    data: str


class ExitFrame(ApiModel):
    """The last frame: a stream that ends without it lost its connection."""

    exit_code: int | None
    signal: int | None = Field(description="the signal that ended it, if one did")
    timed_out: bool


class CommandState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"


class CommandStatus(ApiModel):
    id: str
    argv: list[str]
    pid: int
    background: bool
    state: CommandState
    exit_code: int | None
    signal: int | None
    timed_out: bool
    started_at: float = Field(description="unix time")
    ended_at: float | None = Field(description="unix time")


class CommandList(ApiModel):
    commands: list[CommandStatus] = Field(description="oldest first")


class CommandOutput(ApiModel):
    """A background command's kept output (a ring buffer: the oldest bytes go first)."""

    stream: Literal["stdout", "stderr"]
    offset: int = Field(description="where data starts (later than asked when those bytes were dropped)")
    next_offset: int = Field(description="ask from here for what follows")
    dropped_bytes: int = Field(description="bytes no longer kept")
    data: str
    state: CommandState
    exit_code: int | None


class KillCommand(ApiModel):
    signal: str | int = Field(
        default="SIGKILL",
        json_schema_extra={"anyOf": [{"enum": list(SIGNAL_NAMES)}, {"enum": list(SIGNAL_NUMBERS)}]},
        description="a signal's name (SIGTERM) or number",
    )


class Killed(ApiModel):
    id: str
    signal: str
    delivered: bool = Field(description="false when it had already exited")


class Resized(ApiModel):
    id: str
    rows: int
    cols: int


class StdinWritten(ApiModel):
    id: str
    written: int = Field(description="bytes")
    closed: bool


class FileType(StrEnum):
    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    OTHER = "other"


class FileEntry(ApiModel):
    """One entry, never followed: a symlink names where it resolves (``target``) and what is there."""

    name: str
    type: FileType
    size: int
    mode: int = Field(description="permission bits")
    mtime: float = Field(description="unix time")
    uid: int
    gid: int
    owner: str | None
    group: str | None
    xattrs: dict[str, str] | None = Field(default=None, description="user.* extended attributes, if any")
    target: str | None = None
    target_type: FileType | None = Field(default=None, description="absent when the link dangles")


class FileStat(FileEntry):
    path: str


class FileList(ApiModel):
    path: str
    entries: list[FileEntry] = Field(description="by name")


class FileWritten(ApiModel):
    path: str
    size: int = Field(description="bytes written")


class PathAnswer(ApiModel):
    """The path a mkdir made, or a rename's destination."""

    path: str
