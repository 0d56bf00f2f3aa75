"""The asynchronous client: ``adx.AsyncClient``, the twin of ``adx.Client`` (same names, awaited). It carries out
the same plans (``adx.sdk._plans``), awaiting each step: only the I/O differs."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from functools import partial
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx

from adx.errors import AdxError, InvalidInputError
from adx.model import EnvironmentLogs, EnvironmentStats, IdleAction, LogEntry
from adx.sdk import _plans as plans
from adx.sdk._calls import Call, CallOptions, ClientCore, Plan, Sleep, Steps, request
from adx.sdk._logs import FOLLOW_WAIT_SECONDS, LogsQuery
from adx.sdk._models import CommandOptions, CommandResult, EnvironmentFields, FrameReader, OutputChunk
from adx.sdk._pty import AsyncPty, PtyOptions, pty_body
from adx.sdk._tokens import AsyncTokens
from adx.sdk._volumes import AsyncVolumes
from adx.sdk._wait import RunningWait

T = TypeVar("T")


class AsyncClient(ClientCore):
    """``async with adx.AsyncClient() as client: env = await client.environments.create(...)``."""

    def _open(self, headers: dict[str, str], timeout: httpx.Timeout) -> None:
        self._http = httpx.AsyncClient(
            base_url=self.api_url,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )
        self.environments = AsyncEnvironments(self)
        self.volumes = AsyncVolumes(self)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, plan: Plan[T]) -> T:
        """Carry out ``plan`` as ``Client.run`` does, awaiting each HTTP attempt and each sleep."""
        steps = Steps(plan)
        for step in steps:
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                continue
            try:
                steps.reply = await self._send(step)
            except httpx.HTTPError as exc:
                steps.error = exc
        return steps.result

    async def _send(self, call: Call) -> httpx.Response:
        response = await self._http.send(call.build(self._http), stream=call.stream)
        if not call.accepts(response.status_code):
            await response.aread()  # as Client._send: a refused stream's body carries the error
            await response.aclose()
        return response

    async def request(self, method: str, path: str, **options: Unpack[CallOptions]) -> httpx.Response:
        """See ``Client.request``: the same retry rules."""
        return await self.run(request(self, Call(method, path, **options)))


class AsyncEnvironments:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, **args: Unpack[plans.CreateArgs]) -> AsyncEnvironment:
        """See ``Client.environments.create`` (``wait=SECONDS`` also waits for capacity)."""
        make = partial(AsyncEnvironment, self._client)
        return await self._client.run(plans.create(self._client, make, args))

    async def get(self, environment_id: str) -> AsyncEnvironment:
        return AsyncEnvironment(self._client, await self._client.run(plans.get(self._client, environment_id)))

    async def list(self) -> builtins.list[AsyncEnvironment]:
        return [AsyncEnvironment(self._client, item) for item in await self._client.run(plans.listed(self._client))]

    async def delete(self, environment_id: str) -> AsyncEnvironment:
        return AsyncEnvironment(self._client, await self._client.run(plans.delete(self._client, environment_id)))


class AsyncEnvironment(EnvironmentFields):
    def __init__(self, client: AsyncClient, data: Any) -> None:
        self._client = client
        self._apply(data)
        self.commands = AsyncCommands(client, self)
        self.files = AsyncFiles(client, self)
        self.tokens = AsyncTokens(client, self.id)

    async def _update(self, plan: Plan[Any]) -> AsyncEnvironment:
        self._apply(await self._client.run(plan))
        return self

    async def refresh(self) -> AsyncEnvironment:
        return await self._update(plans.get(self._client, self.id))

    async def delete(self) -> AsyncEnvironment:
        return await self._update(plans.delete(self._client, self.id))

    async def pause(self) -> AsyncEnvironment:
        """See ``Environment.pause``."""
        return await self._update(plans.pause(self._client, self))

    async def resume(self) -> AsyncEnvironment:
        """See ``Environment.resume``."""
        return await self._update(plans.resume(self._client, self))

    async def set_lifetime(self, seconds: float, action: IdleAction | str | None = None) -> AsyncEnvironment:
        """See ``Environment.set_lifetime``."""
        return await self._update(plans.set_lifetime(self._client, self, seconds, action))

    async def set_network(
        self, mode: str = "egress", allow: Sequence[str] | None = None, deny: Sequence[str] | None = None
    ) -> AsyncEnvironment:
        """See ``Environment.set_network``."""
        return await self._update(plans.set_network(self._client, self, mode, allow, deny))

    async def stats(self) -> EnvironmentStats:
        """See ``Environment.stats``."""
        return await self._client.run(plans.stats(self._client, self.id))

    async def logs(self, **query: Unpack[LogsQuery]) -> EnvironmentLogs:
        """See ``Environment.logs``."""
        return await self._client.run(plans.logs(self._client, self.id, query))

    async def follow_logs(self, *, tail: int | None = None, since: datetime | None = None) -> AsyncIterator[LogEntry]:
        """See ``Environment.follow_logs``."""
        page = await self.logs(tail=tail, since=since)
        while True:
            for line in page.lines:
                yield line
            page = await self.logs(cursor=page.cursor or None, since=since, wait_seconds=FOLLOW_WAIT_SECONDS)

    def pty(self, command: str | Sequence[str] | None = None, **options: Unpack[PtyOptions]) -> AsyncPty:
        """``async with env.pty() as term:``; see :class:`AsyncPty`."""
        body = pty_body(command, **options)
        return AsyncPty(self._client, self.id, AsyncCommandStream(self._client, self.id, body, FrameReader()))

    async def wait_until_running(self, timeout: float = 120.0) -> AsyncEnvironment:  # noqa: ASYNC109
        """See ``Environment.wait_until_running``."""
        await self._client.run(plans.wait_running(self._client, self, RunningWait(timeout)))
        return self


class AsyncCommandStream(plans.CommandOutput[AsyncClient], AbstractAsyncContextManager["AsyncCommandStream"]):
    """``async with env.commands.stream("make") as run: async for chunk in run: ...``; then ``await run.result()``."""

    _line_iter: AsyncIterator[str] | None = None  # one iterator: started() and the loops read the same lines in turn

    async def __aenter__(self) -> AsyncCommandStream:
        self._response = await self._client.run(request(self._client, self._call))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._response is not None:
            await self._response.aclose()

    def _lines(self) -> AsyncIterator[str]:
        if self._response is None:
            raise AdxError("use the stream inside an async with block")
        if self._line_iter is None:
            self._line_iter = self._response.aiter_lines()
        return self._line_iter

    async def started(self) -> str:
        """See ``CommandStream.started``: the command's ID, from the first frame."""
        with plans.reading_output():
            async for line in self._lines():
                self._reader.feed(line)
                if self._reader.id:
                    break
        return self._reader.id

    async def __aiter__(self) -> AsyncIterator[OutputChunk]:
        # As CommandStream.__iter__: one line iterator, so a loop that stopped early goes on where it stopped.
        with plans.reading_output():
            async for line in self._lines():
                chunk = self._reader.feed(line)
                if chunk is not None:
                    yield chunk

    async def result(self) -> CommandResult:
        async for _ in self:
            pass
        return self._reader.result()


class AsyncCommands(plans.CommandsCore[AsyncClient]):
    def stream(self, command: str | Sequence[str], **options: Unpack[CommandOptions]) -> AsyncCommandStream:
        """See ``Commands.stream``."""
        return AsyncCommandStream(self._client, *self._parts(command, options))

    async def run(self, command: str | Sequence[str], **options: Unpack[CommandOptions]) -> CommandResult:
        """As ``Commands.run``: a missing program is exit status 127 (126: not executable), as from a shell."""
        try:
            async with self.stream(command, **options) as running:
                return await running.result()
        except InvalidInputError as exc:
            return self._not_started(exc, command, options)


class AsyncFiles(plans.FilesCore[AsyncClient]):
    async def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        await self._client.run(self._write(path, data, mode))

    async def read(self, path: str) -> bytes:
        return await self._client.run(self._read(path))

    async def delete(self, path: str) -> None:
        await self._client.run(self._delete(path))

    async def stat(self, path: str) -> dict[str, Any]:
        return await self._client.run(self._stat(path))

    async def list(self, path: str) -> builtins.list[dict[str, Any]]:
        return await self._client.run(self._list(path))

    async def mkdir(self, path: str) -> None:
        await self._client.run(self._mkdir(path))
