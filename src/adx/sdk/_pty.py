"""A command on a pseudo-terminal in an Environment: ``env.pty()`` and ``await async_env.pty()``.

execd runs a PTY command in the foreground only (a terminal belongs to the client reading it): its output is the
stream of the request that started it (frames ``{"stream": "pty", "data"}``, the terminal's bytes as UTF-8),
its input goes to ``.../commands/{id}/stdin``, its size to ``.../resize``. Leaving the ``with`` block kills a
command still running, so no shell outlives its client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypedDict, TypeVar, Unpack

from adx.errors import AdxError, InvalidInputError
from adx.sdk._calls import C, Call, Plan, json_of, request
from adx.sdk._models import CommandBody, CommandResult, WindowSize, check_keywords, command_body

if TYPE_CHECKING:
    from adx.sdk._async import AsyncClient, AsyncCommandStream  # noqa: F401 (the faces' base classes name them)
    from adx.sdk._client import Client, CommandStream  # noqa: F401

__all__ = ["AsyncPty", "Pty", "PtyOptions", "PtySize", "pty_body"]

#: A login shell: bash where the image has it, else sh.
LOGIN_SHELL = ("/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi")
MAX_SIDE = 65535  # the kernel's window size is two unsigned shorts
S = TypeVar("S")  # the face's command stream


@dataclass(frozen=True)
class PtySize:
    """A terminal's size in character cells."""

    rows: int = 24
    cols: int = 80

    def __post_init__(self) -> None:
        for name in ("rows", "cols"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIDE:
                raise InvalidInputError(f"pty.{name}", f"must be an integer 1-{MAX_SIDE}, got {value!r}")

    def wire(self) -> WindowSize:
        return {"rows": self.rows, "cols": self.cols}


class PtyOptions(TypedDict, total=False):
    """How ``env.pty(command, **)`` starts its terminal (each optional)."""

    rows: int  # default 24
    cols: int  # default 80
    env: Mapping[str, str] | None
    cwd: str | None
    timeout: float | None
    term: str  # TERM (default "xterm")


def pty_body(command: str | Sequence[str] | None, **options: Unpack[PtyOptions]) -> CommandBody:
    """The run request of a PTY command: ``command`` (default: a login shell) with ``TERM`` set."""
    check_keywords("pty", options, PtyOptions)
    size = PtySize(options.get("rows", 24), options.get("cols", 80))
    argv: str | list[str] = (
        list(LOGIN_SHELL) if command is None else command if isinstance(command, str) else list(command)
    )
    env = {"TERM": options.get("term", "xterm"), **(options.get("env") or {})}
    body = command_body(argv, env=env, cwd=options.get("cwd"), timeout=options.get("timeout"), stdin=None)
    body["pty"] = size.wire()
    return body


def _bytes(data: str | bytes) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes):
        return data
    raise InvalidInputError("data", f"must be str or bytes, got {type(data).__name__}")


class _PtyCore(Generic[C, S]):
    """Both faces' terminal requests and answers (``adx.sdk._calls`` plans); each face carries them out."""

    def __init__(self, client: C, environment_id: str, stream: S) -> None:
        self._client = client
        self._stream = stream
        self._base = f"/v1/environments/{environment_id}/commands"
        self._id = ""

    @property
    def id(self) -> str:
        """The command's ID (in ``env.commands`` listings while it runs)."""
        return self._id

    def _path(self, action: str) -> str:
        if not self._id:
            raise AdxError("use the terminal inside a with block")
        return f"{self._base}/{self._id}/{action}"

    def _write(self, data: str | bytes) -> Plan[None]:
        path = self._path("stdin")
        call = Call("POST", path, what="write to the terminal", idempotent=False, content=_bytes(data))
        yield from request(self._client, call)

    def _resize(self, rows: int, cols: int) -> Plan[None]:
        size = PtySize(rows, cols)
        yield from request(
            self._client, Call("POST", self._path("resize"), what="resize", idempotent=True, json=size.wire())
        )

    def _kill(self, signal: str) -> Plan[bool]:
        call = Call("POST", self._path("kill"), what="kill", idempotent=True, json={"signal": signal})
        answer = yield from json_of(self._client, call)
        return bool(answer.get("delivered"))


class Pty(_PtyCore["Client", "CommandStream"], AbstractContextManager["Pty"]):
    """``with env.pty(rows=24, cols=80) as term:`` ``term.write("ls\\n")``; ``for text in term: ...`` reads the
    terminal's output as produced; ``term.resize(rows, cols)``; ``term.kill()``; then ``term.result``."""

    def __enter__(self) -> Pty:
        self._stream.__enter__()
        try:
            self._id = self._stream.started()
        except BaseException:
            self._stream.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._id and not self._stream.finished:
                self.kill()
        except AdxError:
            pass  # hanging up below ends it too: execd kills a foreground command whose client has gone
        finally:
            self._stream.__exit__(exc_type, exc, tb)

    def __iter__(self) -> Iterator[str]:
        for chunk in self._stream:
            yield chunk.data

    def write(self, data: str | bytes) -> None:
        """Type ``data`` (``"\\r"`` is Enter, ``"\\x03"`` Ctrl-C: the terminal's line discipline applies)."""
        self._client.run(self._write(data))

    def resize(self, rows: int, cols: int) -> None:
        self._client.run(self._resize(rows, cols))

    def kill(self, signal: str = "SIGKILL") -> bool:
        """Signal the command's process group; False when it had already exited."""
        return self._client.run(self._kill(signal))

    @property
    def result(self) -> CommandResult:
        """Reads to the end: the exit status (``stdout`` holds what was not read yet)."""
        return self._stream.result


class AsyncPty(_PtyCore["AsyncClient", "AsyncCommandStream"], AbstractAsyncContextManager["AsyncPty"]):
    """``async with env.pty() as term:``: :class:`Pty` for :class:`adx.AsyncClient` (``await term.write(...)``,
    ``async for text in term``, ``await term.result()``)."""

    async def __aenter__(self) -> AsyncPty:
        await self._stream.__aenter__()
        try:
            self._id = await self._stream.started()
        except BaseException:
            await self._stream.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._id and not self._stream.finished:
                await self.kill()
        except AdxError:
            pass  # as Pty: hanging up ends it too
        finally:
            await self._stream.__aexit__(exc_type, exc, tb)

    async def __aiter__(self) -> AsyncIterator[str]:
        async for chunk in self._stream:
            yield chunk.data

    async def write(self, data: str | bytes) -> None:
        await self._client.run(self._write(data))

    async def resize(self, rows: int, cols: int) -> None:
        await self._client.run(self._resize(rows, cols))

    async def kill(self, signal: str = "SIGKILL") -> bool:
        return await self._client.run(self._kill(signal))

    async def result(self) -> CommandResult:
        return await self._stream.result()
