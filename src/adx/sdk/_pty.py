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
from typing import TYPE_CHECKING, Any

from adx.errors import AdxError, InvalidInputError
from adx.sdk._models import CommandResult, command_body

if TYPE_CHECKING:
    from adx.sdk._async import AsyncClient, AsyncCommandStream
    from adx.sdk._client import Client, CommandStream

__all__ = ["AsyncPty", "Pty", "PtySize", "pty_body"]

#: A login shell: bash where the image has it, else sh.
LOGIN_SHELL = ("/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi")
MAX_SIDE = 65535  # the kernel's window size is two unsigned shorts


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

    def wire(self) -> dict[str, int]:
        return {"rows": self.rows, "cols": self.cols}


def pty_body(
    command: str | Sequence[str] | None,
    size: PtySize,
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
    term: str,
) -> dict[str, Any]:
    """The run request of a PTY command: ``command`` (default: a login shell) with ``TERM`` set."""
    argv: str | list[str] = (
        list(LOGIN_SHELL) if command is None else command if isinstance(command, str) else list(command)
    )
    body = command_body(argv, env={"TERM": term, **(env or {})}, cwd=cwd, timeout=timeout, stdin=None)
    body["pty"] = size.wire()
    return body


def _bytes(data: str | bytes) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes):
        return data
    raise InvalidInputError("data", f"must be str or bytes, got {type(data).__name__}")


class _Paths:
    def __init__(self, environment_id: str) -> None:
        self.base = f"/v1/environments/{environment_id}/commands"
        self.id = ""

    def of(self, action: str) -> str:
        if not self.id:
            raise AdxError("use the terminal inside a with block")
        return f"{self.base}/{self.id}/{action}"


class Pty(AbstractContextManager["Pty"]):
    """``with env.pty(rows=24, cols=80) as term:`` ``term.write("ls\\n")``; ``for text in term: ...`` reads the
    terminal's output as produced; ``term.resize(rows, cols)``; ``term.kill()``; then ``term.result``."""

    def __init__(self, client: Client, environment_id: str, stream: CommandStream) -> None:
        self._client = client
        self._stream = stream
        self._paths = _Paths(environment_id)

    @property
    def id(self) -> str:
        """The command's ID (in ``env.commands`` listings while it runs)."""
        return self._paths.id

    def __enter__(self) -> Pty:
        self._stream.__enter__()
        try:
            self._paths.id = self._stream.started()
        except BaseException:
            self._stream.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._paths.id and not self._stream.finished:
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
        self._client.request(
            "POST", self._paths.of("stdin"), content=_bytes(data), what="write to the terminal", idempotent=False
        )

    def resize(self, rows: int, cols: int) -> None:
        size = PtySize(rows, cols)
        self._client.request("POST", self._paths.of("resize"), json=size.wire(), what="resize", idempotent=True)

    def kill(self, signal: str = "SIGKILL") -> bool:
        """Signal the command's process group; False when it had already exited."""
        path = self._paths.of("kill")
        answer = self._client.request("POST", path, json={"signal": signal}, what="kill", idempotent=True)
        return bool(answer.json().get("delivered"))

    @property
    def result(self) -> CommandResult:
        """Reads to the end: the exit status (``stdout`` holds what was not read yet)."""
        return self._stream.result


class AsyncPty(AbstractAsyncContextManager["AsyncPty"]):
    """``async with env.pty() as term:``: :class:`Pty` for :class:`adx.AsyncClient` (``await term.write(...)``,
    ``async for text in term``, ``await term.result()``)."""

    def __init__(self, client: AsyncClient, environment_id: str, stream: AsyncCommandStream) -> None:
        self._client = client
        self._stream = stream
        self._paths = _Paths(environment_id)

    @property
    def id(self) -> str:
        return self._paths.id

    async def __aenter__(self) -> AsyncPty:
        await self._stream.__aenter__()
        try:
            self._paths.id = await self._stream.started()
        except BaseException:
            await self._stream.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._paths.id and not self._stream.finished:
                await self.kill()
        except AdxError:
            pass  # as Pty: hanging up ends it too
        finally:
            await self._stream.__aexit__(exc_type, exc, tb)

    async def __aiter__(self) -> AsyncIterator[str]:
        async for chunk in self._stream:
            yield chunk.data

    async def write(self, data: str | bytes) -> None:
        await self._client.request(
            "POST", self._paths.of("stdin"), content=_bytes(data), what="write to the terminal", idempotent=False
        )

    async def resize(self, rows: int, cols: int) -> None:
        size = PtySize(rows, cols)
        await self._client.request("POST", self._paths.of("resize"), json=size.wire(), what="resize", idempotent=True)

    async def kill(self, signal: str = "SIGKILL") -> bool:
        path = self._paths.of("kill")
        answer = await self._client.request("POST", path, json={"signal": signal}, what="kill", idempotent=True)
        return bool(answer.json().get("delivered"))

    async def result(self) -> CommandResult:
        return await self._stream.result()
