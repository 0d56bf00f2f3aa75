"""What the SDK returns: Environment fields (snake_case of the HTTP object), command results and output."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from adx.errors import InvalidInputError, UncertainOutcomeError
from adx.model import CheckpointRef, EnvironmentState, EnvironmentView, Lifecycle, Resources, VolumeMount, parse_wire
from adx.sdk._errors import BadResponseError


class EnvironmentFields:
    """The fields of an Environment as last read from the API (parsed with the API's own model,
    :class:`adx.model.EnvironmentView`). ``state`` compares equal to its string."""

    id: str
    state: EnvironmentState
    node: str | None
    execution_id: str | None
    created_at: float
    updated_at: float
    image: str
    resources: Resources
    entrypoint: list[str] | None
    metadata: dict[str, str]
    lifecycle: Lifecycle
    volumes: list[VolumeMount]  # the tenant's volumes it mounts
    restart_attempts: int
    restart_pending: bool
    checkpoint: CheckpointRef | None
    expires_at: float | None  # the lifetime deadline (Unix time), if any
    ownership_lost: bool  # paused, and its node is gone: the next resume places it elsewhere
    recovery_pending: bool  # a recovery from a lost node is under way; it goes on by itself
    last_error: str | None
    # The Coordinator is away and this is the owning node's view: a result it finished is not yet stored by the
    # cluster (ENV-6); the state is what the node did, the cluster shows it once the Coordinator is back.
    publication_pending: bool

    def _apply(self, data: Any) -> None:
        try:
            view = parse_wire(EnvironmentView, data, "environment")
        except InvalidInputError as exc:
            raise BadResponseError(f"unexpected Environment object from the API: {exc}") from None
        for name in EnvironmentView.model_fields:
            setattr(self, name, getattr(view, name))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self.state.value!r}, node={self.node!r})"


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a command's output, as produced: ``stream`` is ``"stdout"`` or ``"stderr"``."""

    stream: str
    data: str


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None when the command was killed by a signal
    stdout: str
    stderr: str
    signal: int | str | None = None
    timed_out: bool = False
    id: str = ""
    pid: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class ExitFrame(TypedDict, total=False):
    """execd's last frame of a command's output stream."""

    exitCode: int | None  # None: killed by a signal
    signal: int | str | None
    timedOut: bool


class WindowSize(TypedDict):
    rows: int
    cols: int


class CommandBody(TypedDict, total=False):
    """``POST .../commands``: exactly one of ``command`` (a shell string) and ``argv``."""

    command: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    timeoutSeconds: float
    stdin: str
    stdinBase64: str
    pty: WindowSize  # run on a pseudo-terminal of this size


@dataclass
class FrameReader:
    """Folds execd's NDJSON frames into output chunks and a final result."""

    on_stdout: Callable[[str], object] | None = None
    on_stderr: Callable[[str], object] | None = None
    id: str = ""
    pid: int | None = None
    final: ExitFrame | None = None
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def feed(self, line: str) -> OutputChunk | None:
        if not line.strip():
            return None
        try:
            frame = json.loads(line)
        except ValueError:
            raise BadResponseError(f"command output is not NDJSON: {line[:200]!r}") from None
        if not isinstance(frame, dict):
            raise BadResponseError(f"unexpected command frame: {line[:200]!r}")
        if "exitCode" in frame:
            self.final = cast(ExitFrame, frame)  # its fields are read with .get: a missing one is None
            return None
        if "stream" in frame:
            chunk = OutputChunk(str(frame["stream"]), str(frame.get("data", "")))
            if chunk.stream == "stderr":
                self.err.append(chunk.data)
                if self.on_stderr is not None:
                    self.on_stderr(chunk.data)
            else:
                self.out.append(chunk.data)
                if self.on_stdout is not None:
                    self.on_stdout(chunk.data)
            return chunk
        if "id" in frame:
            self.id = str(frame["id"])
            self.pid = frame.get("pid")
        return None

    def result(self) -> CommandResult:
        if self.final is None:
            raise UncertainOutcomeError(
                f"command {self.id or '?'}: the output stream ended before the exit status "
                "(the connection was lost; the command was killed or may have run in part)"
            )
        return CommandResult(
            exit_code=self.final.get("exitCode"),
            stdout="".join(self.out),
            stderr="".join(self.err),
            signal=self.final.get("signal"),
            timed_out=bool(self.final.get("timedOut", False)),
            id=self.id,
            pid=self.pid,
        )


# What a shell answers when it cannot start a program: 127 "command not found", 126 "Permission denied". A
# string command runs under /bin/sh and gets these from it; an argv list that execd cannot start gets the same
# result, so both forms (and the CLI, and E2B's SDK) agree: a missing program is an exit status, not an error.
_NOT_STARTED = (("executable not found", 127, "command not found"), ("permission denied", 126, "Permission denied"))


def not_started(
    exc: InvalidInputError, command: str | Sequence[str], on_stderr: Callable[[str], object] | None
) -> CommandResult:
    """The shell's result for an argv execd could not start; ``exc`` itself when it is another input error."""
    if exc.field == "argv" and not isinstance(command, str):
        for prefix, status, says in _NOT_STARTED:
            if exc.reason.startswith(prefix):
                text = f"{next(iter(command), '')}: {says}\n"
                if on_stderr is not None:
                    on_stderr(text)
                return CommandResult(exit_code=status, stdout="", stderr=text)
    raise exc


class CommandOptions(TypedDict, total=False):
    """How ``env.commands.run(command, **)`` / ``stream`` run a command (each optional)."""

    env: Mapping[str, str] | None  # added to the Environment's own
    cwd: str | None
    timeout: float | None  # seconds; the command is killed after it (``timed_out``)
    stdin: str | bytes | None
    on_stdout: Callable[[str], object] | None  # called with output as it is produced
    on_stderr: Callable[[str], object] | None


def command_parts(command: str | Sequence[str], options: CommandOptions) -> tuple[CommandBody, FrameReader]:
    """The run request's body and the reader of its output frames."""
    check_keywords("run", options, CommandOptions)
    env = options.get("env")
    body = command_body(
        command if isinstance(command, str) else list(command),
        env=dict(env) if env else None,
        cwd=options.get("cwd"),
        timeout=options.get("timeout"),
        stdin=options.get("stdin"),
    )
    return body, FrameReader(options.get("on_stdout"), options.get("on_stderr"))


def command_body(
    command: str | list[str] | tuple[str, ...],
    *,
    env: dict[str, str] | None,
    cwd: str | None,
    timeout: float | None,
    stdin: str | bytes | None,
) -> CommandBody:
    body: CommandBody = {}
    if isinstance(command, str):
        if not command.strip():
            raise InvalidInputError("command", "must not be empty")
        body["command"] = command
    else:
        argv = list(command)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidInputError("command", "must be a shell string or a non-empty list of strings (argv)")
        body["argv"] = argv
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if timeout is not None:
        body["timeoutSeconds"] = timeout
    if isinstance(stdin, bytes):
        body["stdinBase64"] = base64.b64encode(stdin).decode()
    elif stdin is not None:
        body["stdin"] = stdin
    return body


def check_keywords(where: str, given: Mapping[str, object], allowed: Any) -> None:
    """Keyword arguments typed by a TypedDict (``allowed``) take only its keys: a misspelt one is a TypeError,
    as it is for named parameters, never silently ignored."""
    for name in given:
        if name not in allowed.__required_keys__ | allowed.__optional_keys__:
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")


def check_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidInputError("path", f"must be an absolute path inside the Environment, got {path!r}")
    return path
