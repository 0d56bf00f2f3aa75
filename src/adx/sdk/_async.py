"""The asynchronous client: ``adx.AsyncClient``, the twin of ``adx.Client`` (same names, awaited)."""

from __future__ import annotations

import asyncio
import builtins
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from adx.errors import AdxError, InvalidInputError, NoCapacityError
from adx.errors import WaitTimeoutError as StateWaitTimeoutError
from adx.model import EnvironmentLogs, EnvironmentState, EnvironmentStats, IdleAction, LogEntry, PauseOptions, Volume
from adx.model import RestartPolicy as _RestartPolicy
from adx.sdk._client import (
    DEFAULT_TIMEOUT,
    NOT_RETRIED,
    RETRY_STATUSES,
    USER_AGENT,
    CapacityWait,
    backoff,
    call_timeout,
    retry_delay,
)
from adx.sdk._errors import error_code, error_from_response, transport_error
from adx.sdk._logs import FOLLOW_WAIT_SECONDS, logs_params
from adx.sdk._models import (
    CommandResult,
    EnvironmentFields,
    FrameReader,
    OutputChunk,
    check_path,
    command_body,
    not_started,
)
from adx.sdk._pty import AsyncPty, PtySize, pty_body
from adx.sdk._settings import resolve
from adx.sdk._spec import RESUME_TIMEOUT_SECONDS, build_spec, lifetime_body, network_body, pause_call_timeout
from adx.sdk._tokens import AsyncTokens
from adx.sdk._volumes import AsyncVolumes
from adx.sdk._wait import RunningWait, check_waitable


class AsyncClient:
    """``async with adx.AsyncClient() as client: env = await client.environments.create(...)``."""

    def __init__(
        self,
        api_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = 3,
    ) -> None:
        settings = resolve(api_url, api_key)
        self.api_url = settings.api_url
        self.retries = retries
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=settings.api_url,
            headers={"Authorization": f"Bearer {settings.api_key}", "User-Agent": USER_AGENT},
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
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

    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        idempotent: bool,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - httpx's own per-call timeout, as in Client.request
    ) -> httpx.Response:
        """See ``Client.request``: the same retry rules."""
        per_call = call_timeout(timeout)
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            refused: httpx.Response | None = None
            try:
                response = await self._http.request(
                    method, path, params=params, json=json, content=content, headers=headers, timeout=per_call
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if last:
                    raise transport_error(exc, what, sent=False) from None
            except httpx.HTTPError as exc:
                if last or not idempotent:
                    raise transport_error(exc, what, sent=True) from None
            else:
                if response.status_code < 400:
                    return response
                retry = idempotent and response.status_code in RETRY_STATUSES and not last
                if not retry or error_code(response.content) in NOT_RETRIED:
                    raise error_from_response(method, response.status_code, response.content, what, self.api_url)
                refused = response
            await asyncio.sleep(retry_delay(attempt, refused))
        raise AssertionError("unreachable")


class AsyncEnvironments:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        *,
        cpu: float | str = 1,
        memory: int | str = "512Mi",
        disk: int | str | None = None,
        image: str | None = None,
        entrypoint: Sequence[str] | None = None,
        idle_timeout: float | None = None,
        idle_action: IdleAction | str | None = None,
        pause: PauseOptions | None = None,
        restart: _RestartPolicy | None = None,
        execd_health_failure_threshold: int | None = None,
        lifetime: float | None = None,
        lifetime_action: IdleAction | str | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        network: Mapping[str, Any] | None = None,
        volumes: Mapping[str, str | Volume] | None = None,
        wait: bool | float = True,
        wait_timeout: float = 120.0,
        idempotency_key: str | None = None,
    ) -> AsyncEnvironment:
        """See ``Client.environments.create`` (``wait=SECONDS`` also waits for capacity)."""
        capacity = CapacityWait(wait)
        spec = build_spec(
            cpu=cpu,
            memory=memory,
            disk=disk,
            image=image,
            entrypoint=entrypoint,
            idle_timeout=idle_timeout,
            idle_action=idle_action,
            pause=pause,
            restart=restart,
            execd_health_failure_threshold=execd_health_failure_threshold,
            lifetime=lifetime,
            lifetime_action=lifetime_action,
            env=env,
            metadata=metadata,
            network=network,
            volumes=volumes,
        )
        key = idempotency_key or str(uuid.uuid4())
        while True:
            # Counted from the create that is taken: a wait for capacity before it does not shorten it.
            running = RunningWait(wait_timeout) if wait is not False else None
            try:
                response = await self._client.request(
                    "POST",
                    "/v1/environments",
                    what="create environment",
                    idempotent=True,
                    json=spec,
                    headers={"Idempotency-Key": key},
                    # The server answers once it runs (the rest of the wait, if any, below).
                    params=running.params() if running else None,
                    timeout=running.call_timeout(self._client.timeout) if running else None,
                )
                break
            except NoCapacityError as refused:
                await asyncio.sleep(capacity.delay(refused))
        environment = AsyncEnvironment(self._client, response.json())
        if running is not None:
            await environment._wait_running(running)
        return environment

    async def get(self, environment_id: str) -> AsyncEnvironment:
        response = await self._client.request(
            "GET", f"/v1/environments/{environment_id}", what=f"get {environment_id}", idempotent=True
        )
        return AsyncEnvironment(self._client, response.json())

    async def list(self) -> builtins.list[AsyncEnvironment]:
        response = await self._client.request("GET", "/v1/environments", what="list environments", idempotent=True)
        return [AsyncEnvironment(self._client, item) for item in response.json()["environments"]]

    async def delete(self, environment_id: str) -> AsyncEnvironment:
        response = await self._client.request(
            "DELETE", f"/v1/environments/{environment_id}", what=f"delete {environment_id}", idempotent=True
        )
        return AsyncEnvironment(self._client, response.json())


class AsyncEnvironment(EnvironmentFields):
    def __init__(self, client: AsyncClient, data: Any) -> None:
        self._client = client
        self._apply(data)
        self.commands = AsyncCommands(client, self)
        self.files = AsyncFiles(client, self)
        self.tokens = AsyncTokens(client, self.id)

    async def refresh(self) -> AsyncEnvironment:
        response = await self._client.request(
            "GET", f"/v1/environments/{self.id}", what=f"get {self.id}", idempotent=True
        )
        self._apply(response.json())
        return self

    async def delete(self) -> AsyncEnvironment:
        response = await self._client.request(
            "DELETE", f"/v1/environments/{self.id}", what=f"delete {self.id}", idempotent=True
        )
        self._apply(response.json())
        return self

    async def pause(self) -> AsyncEnvironment:
        """See ``Environment.pause``."""
        response = await self._client.request(
            "POST",
            f"/v1/environments/{self.id}/pause",
            what=f"pause {self.id}",
            idempotent=True,
            timeout=pause_call_timeout(self.lifecycle, self._client.timeout),
        )
        self._apply(response.json())
        return self

    async def resume(self) -> AsyncEnvironment:
        """See ``Environment.resume``."""
        response = await self._client.request(
            "POST",
            f"/v1/environments/{self.id}/resume",
            what=f"resume {self.id}",
            idempotent=True,
            timeout=max(self._client.timeout, RESUME_TIMEOUT_SECONDS),
        )
        self._apply(response.json())
        return self

    async def set_lifetime(self, seconds: float, action: IdleAction | str | None = None) -> AsyncEnvironment:
        """See ``Environment.set_lifetime``."""
        response = await self._client.request(
            "POST",
            f"/v1/environments/{self.id}/lifetime",
            what=f"set lifetime of {self.id}",
            idempotent=True,
            json=lifetime_body(seconds, action),
        )
        self._apply(response.json())
        return self

    async def set_network(
        self, mode: str = "egress", allow: Sequence[str] | None = None, deny: Sequence[str] | None = None
    ) -> AsyncEnvironment:
        """Replace the network policy: ``mode`` "none" (only lo) or "egress" (through the node, NAT), ``allow``
        (only these, plus DNS) and ``deny`` (wins) lists of CIDRs or DNS names (resolved when applied). A running
        Environment gets it without a restart; a paused one when it resumes."""
        response = await self._client.request(
            "POST",
            f"/v1/environments/{self.id}/network",
            what=f"set network of {self.id}",
            idempotent=True,
            json=network_body(mode, allow, deny),
        )
        self._apply(response.json())
        return self

    async def stats(self) -> EnvironmentStats:
        """See ``Environment.stats``."""
        response = await self._client.request(
            "GET", f"/v1/environments/{self.id}/stats", what=f"stats of {self.id}", idempotent=True
        )
        return EnvironmentStats.model_validate(response.json())

    async def logs(
        self,
        *,
        tail: int | None = None,
        since: datetime | None = None,
        cursor: str | None = None,
        limit: int = 1000,
        wait_seconds: float = 0.0,
    ) -> EnvironmentLogs:
        """See ``Environment.logs``."""
        params = logs_params(tail=tail, since=since, cursor=cursor, limit=limit, wait_seconds=wait_seconds)
        response = await self._client.request(
            "GET",
            f"/v1/environments/{self.id}/logs",
            what=f"logs of {self.id}",
            idempotent=True,
            params=params,
            timeout=self._client.timeout + wait_seconds,
        )
        return EnvironmentLogs.model_validate(response.json())

    async def follow_logs(self, *, tail: int | None = None, since: datetime | None = None) -> AsyncIterator[LogEntry]:
        """See ``Environment.follow_logs``."""
        page = await self.logs(tail=tail, since=since)
        while True:
            for line in page.lines:
                yield line
            page = await self.logs(cursor=page.cursor or None, since=since, wait_seconds=FOLLOW_WAIT_SECONDS)

    # The same parameter names as the sync twin: the SDK's two clients read the same.
    def pty(
        self,
        command: str | Sequence[str] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        term: str = "xterm",
    ) -> AsyncPty:
        """``async with env.pty() as term:``; see :class:`AsyncPty`."""
        body = pty_body(command, PtySize(rows, cols), env=env, cwd=cwd, timeout=timeout, term=term)
        return AsyncPty(self._client, self.id, AsyncCommandStream(self._client, self.id, body, FrameReader()))

    async def wait_until_running(self, timeout: float = 120.0) -> AsyncEnvironment:  # noqa: ASYNC109
        """See ``Environment.wait_until_running``."""
        return await self._wait_running(RunningWait(timeout))

    async def _wait_running(self, running: RunningWait) -> AsyncEnvironment:
        while self.state is not EnvironmentState.RUNNING:
            check_waitable(self)
            pause = running.pause(self)
            if pause:
                await asyncio.sleep(pause)
            try:
                response = await self._client.request(
                    "GET",
                    f"/v1/environments/{self.id}",
                    what=f"wait for {self.id} to run",
                    idempotent=True,
                    params=running.params(),
                    timeout=running.call_timeout(self._client.timeout),
                )
            except StateWaitTimeoutError:
                continue  # the server's wait ended first; ours may go on
            self._apply(response.json())
            running.answered(self)
        return self


class AsyncCommandStream(AbstractAsyncContextManager["AsyncCommandStream"]):
    """``async with env.commands.stream("make") as run: async for chunk in run: ...``; then ``await run.result()``."""

    def __init__(self, client: AsyncClient, environment_id: str, body: dict[str, Any], reader: FrameReader) -> None:
        self._client = client
        self._path = f"/v1/environments/{environment_id}/commands"
        self._body = body
        self._reader = reader
        self._response: httpx.Response | None = None
        self._line_iter: AsyncIterator[str] | None = None

    async def __aenter__(self) -> AsyncCommandStream:
        what = "run command"
        timeout = httpx.Timeout(DEFAULT_TIMEOUT, read=None)  # a command may be quiet for long
        for attempt in range(self._client.retries + 1):
            request = self._client._http.build_request("POST", self._path, json=self._body, timeout=timeout)
            try:
                response = await self._client._http.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == self._client.retries:
                    raise transport_error(exc, what, sent=False) from None
                await asyncio.sleep(backoff(attempt))
                continue
            except httpx.HTTPError as exc:
                raise transport_error(exc, what, sent=True) from None
            if response.status_code != 200:
                body = await response.aread()
                await response.aclose()
                raise error_from_response("POST", response.status_code, body, what, self._client.api_url)
            self._response = response
            return self
        raise AssertionError("unreachable")

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._response is not None:
            await self._response.aclose()

    def _lines(self) -> AsyncIterator[str]:
        if self._response is None:
            raise AdxError("use the stream inside an async with block")
        if self._line_iter is None:  # one iterator: started() and __aiter__ read the same lines in turn
            self._line_iter = self._response.aiter_lines()
        return self._line_iter

    async def started(self) -> str:
        """See ``CommandStream.started``: the command's ID, from the first frame."""
        try:
            async for line in self._lines():
                self._reader.feed(line)
                if self._reader.id:
                    break
        except httpx.HTTPError as exc:
            raise transport_error(exc, "run command", sent=True) from None
        return self._reader.id

    @property
    def finished(self) -> bool:
        return self._reader.final is not None

    async def __aiter__(self) -> AsyncIterator[OutputChunk]:
        # Lines come from one iterator: a loop that stopped early (env.pty() reads up to a prompt) and iterates
        # again goes on where it stopped.
        try:
            async for line in self._lines():
                chunk = self._reader.feed(line)
                if chunk is not None:
                    yield chunk
        except httpx.HTTPError as exc:
            raise transport_error(exc, "run command", sent=True) from None

    async def result(self) -> CommandResult:
        async for _ in self:
            pass
        return self._reader.result()


class AsyncCommands:
    def __init__(self, client: AsyncClient, environment: AsyncEnvironment) -> None:
        self._client = client
        self._environment = environment

    def stream(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
    ) -> AsyncCommandStream:
        body = command_body(
            command if isinstance(command, str) else list(command),
            env=dict(env) if env else None,
            cwd=cwd,
            timeout=timeout,
            stdin=stdin,
        )
        return AsyncCommandStream(self._client, self._environment.id, body, FrameReader(on_stdout, on_stderr))

    async def run(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the command's own timeout inside the Environment
        stdin: str | bytes | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
    ) -> CommandResult:
        """As ``Commands.run``: a missing program is exit status 127 (126: not executable), as from a shell."""
        try:
            async with self.stream(
                command, env=env, cwd=cwd, timeout=timeout, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr
            ) as running:
                return await running.result()
        except InvalidInputError as exc:
            result = not_started(exc, command, on_stderr)
            if result is None:
                raise
            return result


class AsyncFiles:
    def __init__(self, client: AsyncClient, environment: AsyncEnvironment) -> None:
        self._client = client
        self._environment = environment

    def _path(self, suffix: str = "") -> str:
        return f"/v1/environments/{self._environment.id}/files{suffix}"

    async def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        params = {"path": check_path(path)}
        if mode is not None:
            params["mode"] = f"{mode:o}"
        content = data.encode() if isinstance(data, str) else bytes(data)
        await self._client.request(
            "PUT", self._path(), what=f"write {path}", idempotent=True, params=params, content=content
        )

    async def read(self, path: str) -> bytes:
        response = await self._client.request(
            "GET", self._path(), what=f"read {path}", idempotent=True, params={"path": check_path(path)}
        )
        return response.content

    async def delete(self, path: str) -> None:
        await self._client.request(
            "DELETE", self._path(), what=f"delete {path}", idempotent=True, params={"path": check_path(path)}
        )

    async def stat(self, path: str) -> dict[str, Any]:
        response = await self._client.request(
            "GET", self._path("/stat"), what=f"stat {path}", idempotent=True, params={"path": check_path(path)}
        )
        result: dict[str, Any] = response.json()
        return result

    async def list(self, path: str) -> builtins.list[dict[str, Any]]:
        response = await self._client.request(
            "GET", self._path("/list"), what=f"list {path}", idempotent=True, params={"path": check_path(path)}
        )
        entries: builtins.list[dict[str, Any]] = response.json()["entries"]
        return entries

    async def mkdir(self, path: str) -> None:
        await self._client.request(
            "POST", self._path("/mkdir"), what=f"mkdir {path}", idempotent=True, params={"path": check_path(path)}
        )
