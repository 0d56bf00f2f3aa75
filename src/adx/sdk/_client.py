"""The synchronous client: ``adx.Client``. What it sends and what the answers mean are the plans of
``adx.sdk._plans`` (shared with ``adx.AsyncClient``); this face carries them out, blocking."""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from functools import partial
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx

from adx.errors import AdxError, InvalidInputError
from adx.model import EnvironmentLogs, EnvironmentStats, IdleAction, LogEntry
from adx.sdk import _plans as plans
from adx.sdk._calls import MAX_RETRY_AFTER as MAX_RETRY_AFTER  # importable here, as before the core existed
from adx.sdk._calls import Call, CallOptions, ClientCore, Plan, Sleep, Steps, request
from adx.sdk._calls import backoff as backoff
from adx.sdk._calls import retry_delay as retry_delay
from adx.sdk._logs import FOLLOW_WAIT_SECONDS, LogsQuery
from adx.sdk._models import CommandOptions, CommandResult, EnvironmentFields, FrameReader, OutputChunk
from adx.sdk._pty import Pty, PtyOptions, pty_body
from adx.sdk._tokens import Tokens
from adx.sdk._volumes import Volumes
from adx.sdk._wait import RunningWait

T = TypeVar("T")


class Client(ClientCore):
    """A connection to the ADX API. ``Client()`` finds the API in ADX_API_URL / ADX_API_KEY or in the
    credentials file ``adx up`` writes; ``Client(api_url=..., api_key=...)`` names it."""

    def _open(self, headers: dict[str, str], timeout: httpx.Timeout) -> None:
        self._http = httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout)
        self.environments = Environments(self)
        self.volumes = Volumes(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, plan: Plan[T]) -> T:
        """Carry out ``plan``: each Call is one HTTP attempt, each Sleep a blocking sleep."""
        steps = Steps(plan)
        for step in steps:
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                continue
            try:
                steps.reply = self._send(step)
            except httpx.HTTPError as exc:
                steps.error = exc
        return steps.result

    def _send(self, call: Call) -> httpx.Response:
        response = self._http.send(call.build(self._http), stream=call.stream)
        if not call.accepts(response.status_code):
            response.read()  # a refused stream's body carries the error (a plain answer is read already)
            response.close()
        return response

    def request(self, method: str, path: str, **options: Unpack[CallOptions]) -> httpx.Response:
        """One API call with bounded retries (``adx.sdk._calls.request``): a request that never left is always
        retried; one that may have reached the server only when repeating it is harmless (``idempotent``)."""
        return self.run(request(self, Call(method, path, **options)))


class Environments:
    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, **args: Unpack[plans.CreateArgs]) -> Environment:
        """Create an Environment from ``spec`` (``cpu=1, memory="512Mi"``, ``image``, ``entrypoint``,
        ``idle_timeout``... see :class:`adx.sdk._spec.SpecArgs`); with ``wait`` (default) return once it is
        running (within ``wait_timeout``).

        ``wait=SECONDS``: also wait up to SECONDS for capacity: a create no node has room for now (503
        ``no_capacity``) is sent again after the server's ``Retry-After`` until then, and then raises
        NoCapacityError saying so. Without it, a capacity refusal raises at once.

        The request carries an Idempotency-Key (a fresh one unless given), so the SDK's own retries after a
        lost reply can never create two Environments.
        """
        make = partial(Environment, self._client)
        return self._client.run(plans.create(self._client, make, args))

    def get(self, environment_id: str) -> Environment:
        return Environment(self._client, self._client.run(plans.get(self._client, environment_id)))

    def list(self) -> builtins.list[Environment]:
        return [Environment(self._client, item) for item in self._client.run(plans.listed(self._client))]

    def delete(self, environment_id: str) -> Environment:
        return Environment(self._client, self._client.run(plans.delete(self._client, environment_id)))


class Environment(EnvironmentFields):
    """One Environment. Fields mirror the HTTP object in snake_case; ``refresh()`` reads them again."""

    def __init__(self, client: Client, data: Any) -> None:
        self._client = client
        self._apply(data)
        self.commands = Commands(client, self)
        self.files = Files(client, self)
        self.tokens = Tokens(client, self.id)

    def _update(self, plan: Plan[Any]) -> Environment:
        self._apply(self._client.run(plan))
        return self

    def refresh(self) -> Environment:
        return self._update(plans.get(self._client, self.id))

    def delete(self) -> Environment:
        return self._update(plans.delete(self._client, self.id))

    def pause(self) -> Environment:
        """Checkpoint, publish and release its resources; returns once ``paused`` (ConflictError if it is not
        running). The call may take as long as the capture's ``pauseOptions.timeoutSeconds`` allows."""
        return self._update(plans.pause(self._client, self))

    def resume(self) -> Environment:
        """Resume a paused Environment; returns once ``running`` (a running one is returned as it is)."""
        return self._update(plans.resume(self._client, self))

    def set_lifetime(self, seconds: float, action: IdleAction | str | None = None) -> Environment:
        """Move the lifetime deadline to now + ``seconds`` (``expires_at``); at the deadline it is deleted or
        paused (``action``; default: keep the current ``lifecycle.lifetime_action``)."""
        return self._update(plans.set_lifetime(self._client, self, seconds, action))

    def set_network(
        self, mode: str = "egress", allow: Sequence[str] | None = None, deny: Sequence[str] | None = None
    ) -> Environment:
        """Replace the network policy: ``mode`` "none" (only lo) or "egress" (through the node, NAT), ``allow``
        (only these, plus DNS) and ``deny`` (wins) lists of CIDRs or DNS names (resolved when applied). A running
        Environment gets it without a restart; a paused one when it resumes."""
        return self._update(plans.set_network(self._client, self, mode, allow, deny))

    def stats(self) -> EnvironmentStats:
        """CPU, memory and disk usage of the running Environment, from its node's last sample (``sample_age_seconds``
        says how old). A paused Environment is not woken: EnvironmentPausedError."""
        return self._client.run(plans.stats(self._client, self.id))

    def logs(self, **query: Unpack[LogsQuery]) -> EnvironmentLogs:
        """One page of the workload's stdout and stderr (every execution: a restart continues the log), oldest
        first: from the oldest kept line, the last ``tail`` lines, lines read since ``since``, or those after
        ``cursor`` (from an earlier page); at most ``limit`` (1000). ``wait_seconds``: wait that long for a new
        line. A paused Environment's logs are read without waking it."""
        return self._client.run(plans.logs(self._client, self.id, query))

    def follow_logs(self, *, tail: int | None = None, since: datetime | None = None) -> Iterator[LogEntry]:
        """Every line as it is written (``tail``/``since`` choose where to start), until the caller stops
        iterating. Long polls with the page cursor: a dropped connection loses and repeats nothing."""
        page = self.logs(tail=tail, since=since)
        while True:
            yield from page.lines
            page = self.logs(cursor=page.cursor or None, since=since, wait_seconds=FOLLOW_WAIT_SECONDS)

    def pty(self, command: str | Sequence[str] | None = None, **options: Unpack[PtyOptions]) -> Pty:
        """``with env.pty() as term:`` a login shell (or ``command``) on a pseudo-terminal (``rows=24, cols=80``,
        ``env``, ``cwd``, ``timeout``, ``term="xterm"``); see :class:`Pty`."""
        body = pty_body(command, **options)
        return Pty(self._client, self.id, CommandStream(self._client, self.id, body, FrameReader()))

    def wait_until_running(self, timeout: float = 120.0) -> Environment:
        """Wait until ``running``; WaitTimeoutError after ``timeout`` s, ConflictError if it failed or is deleted.
        The server waits (``?wait=running``): the answer comes as the start is committed, not at a poll."""
        self._client.run(plans.wait_running(self._client, self, RunningWait(timeout)))
        return self


class CommandStream(plans.CommandOutput[Client], AbstractContextManager["CommandStream"]):
    """``with env.commands.stream("make") as run: for chunk in run: ...``; then ``run.result``."""

    _line_iter: Iterator[str] | None = None  # one iterator: started() and the loops read the same lines in turn

    def __enter__(self) -> CommandStream:
        self._response = self._client.run(request(self._client, self._call))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._response is not None:
            self._response.close()  # hanging up kills a still-running foreground command

    def _lines(self) -> Iterator[str]:
        if self._response is None:
            raise AdxError("use the stream inside a with block")
        if self._line_iter is None:
            self._line_iter = self._response.iter_lines()
        return self._line_iter

    def started(self) -> str:
        """Read up to the start frame (always the first) and answer the command's ID; no output is skipped."""
        with plans.reading_output():
            for line in self._lines():
                self._reader.feed(line)
                if self._reader.id:
                    break
        return self._reader.id

    def __iter__(self) -> Iterator[OutputChunk]:
        # Lines come from one iterator: a loop that stopped early (env.pty() reads up to a prompt) and iterates
        # again goes on where it stopped.
        with plans.reading_output():
            for line in self._lines():
                chunk = self._reader.feed(line)
                if chunk is not None:
                    yield chunk

    @property
    def result(self) -> CommandResult:
        for _ in self:
            pass
        return self._reader.result()


class Commands(plans.CommandsCore[Client]):
    def stream(self, command: str | Sequence[str], **options: Unpack[CommandOptions]) -> CommandStream:
        """``command`` (a shell string, or an argv list) started, its output read as it comes (see
        :class:`adx.sdk._models.CommandOptions`: ``env``, ``cwd``, ``timeout``, ``stdin``, ``on_stdout``...)."""
        return CommandStream(self._client, *self._parts(command, options))

    def run(self, command: str | Sequence[str], **options: Unpack[CommandOptions]) -> CommandResult:
        """Run ``command`` (a shell string, or an argv list) and wait for it. ``on_stdout``/``on_stderr`` get
        output as it is produced. A non-zero exit is a result, not an error; so is a program that does not
        exist (127) or cannot be executed (126), as from a shell."""
        try:
            with self.stream(command, **options) as running:
                return running.result
        except InvalidInputError as exc:
            return self._not_started(exc, command, options)


class Files(plans.FilesCore[Client]):
    def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._client.run(self._write(path, data, mode))

    def read(self, path: str) -> bytes:
        return self._client.run(self._read(path))

    def delete(self, path: str) -> None:
        self._client.run(self._delete(path))

    def stat(self, path: str) -> dict[str, Any]:
        return self._client.run(self._stat(path))

    def list(self, path: str) -> builtins.list[dict[str, Any]]:
        return self._client.run(self._list(path))

    def mkdir(self, path: str) -> None:
        self._client.run(self._mkdir(path))
