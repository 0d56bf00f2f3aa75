"""The synchronous client: ``adx.Client``."""

from __future__ import annotations

import builtins
import math
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from adx._backoff import capped_exponential
from adx.errors import AdxError, InvalidInputError, NoCapacityError
from adx.errors import WaitTimeoutError as StateWaitTimeoutError
from adx.model import EnvironmentLogs, EnvironmentState, EnvironmentStats, IdleAction, LogEntry, PauseOptions, Volume
from adx.model import RestartPolicy as _RestartPolicy
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
from adx.sdk._pty import Pty, PtySize, pty_body
from adx.sdk._settings import resolve
from adx.sdk._spec import RESUME_TIMEOUT_SECONDS, build_spec, lifetime_body, network_body, pause_call_timeout
from adx.sdk._tokens import Tokens
from adx.sdk._volumes import Volumes
from adx.sdk._wait import RunningWait, check_waitable

USER_AGENT = "adx-python/0.1"
DEFAULT_TIMEOUT = 30.0
RETRY_STATUSES = frozenset({502, 503, 504})  # only for requests that are safe to repeat (idempotent=True)
#: Error codes of a 503 that asking again at once would not help: no capacity (``create(wait=SECONDS)`` waits
#: for it with the server's Retry-After), a server's wait for running that ended (the caller's own wait goes on).
NOT_RETRIED = frozenset({"no_capacity", "wait_timeout"})


#: The longest ``Retry-After`` the SDK honours between two attempts (a larger one is capped: calls stay bounded).
MAX_RETRY_AFTER = 10.0


def backoff(attempt: int) -> float:
    return capped_exponential(0.2, 2.0, attempt)


def retry_delay(attempt: int, response: httpx.Response | None) -> float:
    """How long to wait before attempt ``attempt + 1``: the server's ``Retry-After`` (seconds) when it said
    when to come back (e.g. a create refused during a short outage), else the client's own backoff."""
    raw = response.headers.get("retry-after") if response is not None else None
    if raw is not None:
        try:
            seconds = float(raw)
        except ValueError:
            seconds = -1.0  # an HTTP date or garbage: fall back to the backoff
        if seconds >= 0:
            return min(seconds, MAX_RETRY_AFTER)
    return backoff(attempt)


class CapacityWait:
    """``create(wait=SECONDS)``: a create the cluster refuses for capacity (503 ``no_capacity``) is sent again,
    after the server's ``Retry-After``, until SECONDS have passed. ``wait=True``/``False``: no such waiting."""

    def __init__(self, wait: bool | float) -> None:
        self.seconds: float | None = None
        if not isinstance(wait, bool):
            if not isinstance(wait, int | float) or not math.isfinite(wait) or wait < 0:
                raise InvalidInputError("wait", f"must be True, False or a number of seconds >= 0, got {wait!r}")
            self.seconds = float(wait)
        self.started = time.monotonic()
        self.attempt = 0

    def delay(self, refused: NoCapacityError) -> float:
        """Seconds to wait before sending the create again; raises when the wait is over (or was never asked
        for): the refusal itself, or a NoCapacityError saying how long it waited."""
        if self.seconds is None:
            raise refused
        remaining = self.started + self.seconds - time.monotonic()
        if remaining <= 0:
            raise NoCapacityError(
                f"no capacity for this Environment within wait={self.seconds:g}s (nothing was created): "
                f"{refused.message}",
                details={**refused.details, "waited_seconds": self.seconds},
            ) from refused
        hint = refused.details.get("retry_after_seconds")
        delay = float(hint) if isinstance(hint, int | float) and hint >= 0 else backoff(self.attempt)
        self.attempt += 1
        return min(delay, MAX_RETRY_AFTER, remaining)


def call_timeout(seconds: float | None) -> Any:
    """A per-call httpx timeout (None: the client's own). Connecting never waits longer than 10 s."""
    if seconds is None:
        return httpx.USE_CLIENT_DEFAULT
    return httpx.Timeout(seconds, connect=min(seconds, 10.0))


class Client:
    """A connection to the ADX API. ``Client()`` finds the API in ADX_API_URL / ADX_API_KEY or in the
    credentials file ``adx up`` writes; ``Client(api_url=..., api_key=...)`` names it."""

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
        self._http = httpx.Client(
            base_url=settings.api_url,
            headers={"Authorization": f"Bearer {settings.api_key}", "User-Agent": USER_AGENT},
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
        )
        self.environments = Environments(self)
        self.volumes = Volumes(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
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
        timeout: float | None = None,
    ) -> httpx.Response:
        """One API call with bounded retries: a request that never left is always retried; one that may have
        reached the server only when repeating it is harmless (``idempotent``)."""
        per_call = call_timeout(timeout)
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            refused: httpx.Response | None = None
            try:
                response = self._http.request(
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
            time.sleep(retry_delay(attempt, refused))
        raise AssertionError("unreachable")


class Environments:
    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
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
    ) -> Environment:
        """Create an Environment; with ``wait`` (default) return once it is running (within ``wait_timeout``).

        ``wait=SECONDS``: also wait up to SECONDS for capacity: a create no node has room for now (503
        ``no_capacity``) is sent again after the server's ``Retry-After`` until then, and then raises
        NoCapacityError saying so. Without it, a capacity refusal raises at once.

        The request carries an Idempotency-Key (a fresh one unless given), so the SDK's own retries after a
        lost reply can never create two Environments.
        """
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
                response = self._client.request(
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
                time.sleep(capacity.delay(refused))
        environment = Environment(self._client, response.json())
        if running is not None:
            environment._wait_running(running)
        return environment

    def get(self, environment_id: str) -> Environment:
        response = self._client.request(
            "GET", f"/v1/environments/{environment_id}", what=f"get {environment_id}", idempotent=True
        )
        return Environment(self._client, response.json())

    def list(self) -> builtins.list[Environment]:
        response = self._client.request("GET", "/v1/environments", what="list environments", idempotent=True)
        return [Environment(self._client, item) for item in response.json()["environments"]]

    def delete(self, environment_id: str) -> Environment:
        response = self._client.request(
            "DELETE", f"/v1/environments/{environment_id}", what=f"delete {environment_id}", idempotent=True
        )
        return Environment(self._client, response.json())


class Environment(EnvironmentFields):
    """One Environment. Fields mirror the HTTP object in snake_case; ``refresh()`` reads them again."""

    def __init__(self, client: Client, data: Any) -> None:
        self._client = client
        self._apply(data)
        self.commands = Commands(client, self)
        self.files = Files(client, self)
        self.tokens = Tokens(client, self.id)

    def refresh(self) -> Environment:
        response = self._client.request("GET", f"/v1/environments/{self.id}", what=f"get {self.id}", idempotent=True)
        self._apply(response.json())
        return self

    def delete(self) -> Environment:
        response = self._client.request(
            "DELETE", f"/v1/environments/{self.id}", what=f"delete {self.id}", idempotent=True
        )
        self._apply(response.json())
        return self

    def pause(self) -> Environment:
        """Checkpoint, publish and release its resources; returns once ``paused`` (ConflictError if it is not
        running). The call may take as long as the capture's ``pauseOptions.timeoutSeconds`` allows."""
        response = self._client.request(
            "POST",
            f"/v1/environments/{self.id}/pause",
            what=f"pause {self.id}",
            idempotent=True,
            timeout=pause_call_timeout(self.lifecycle, self._client.timeout),
        )
        self._apply(response.json())
        return self

    def resume(self) -> Environment:
        """Resume a paused Environment; returns once ``running`` (a running one is returned as it is)."""
        response = self._client.request(
            "POST",
            f"/v1/environments/{self.id}/resume",
            what=f"resume {self.id}",
            idempotent=True,
            timeout=max(self._client.timeout, RESUME_TIMEOUT_SECONDS),
        )
        self._apply(response.json())
        return self

    def set_lifetime(self, seconds: float, action: IdleAction | str | None = None) -> Environment:
        """Move the lifetime deadline to now + ``seconds`` (``expires_at``); at the deadline it is deleted or
        paused (``action``; default: keep the current ``lifecycle.lifetime_action``)."""
        response = self._client.request(
            "POST",
            f"/v1/environments/{self.id}/lifetime",
            what=f"set lifetime of {self.id}",
            idempotent=True,
            json=lifetime_body(seconds, action),
        )
        self._apply(response.json())
        return self

    def set_network(
        self, mode: str = "egress", allow: Sequence[str] | None = None, deny: Sequence[str] | None = None
    ) -> Environment:
        """Replace the network policy: ``mode`` "none" (only lo) or "egress" (through the node, NAT), ``allow``
        (only these, plus DNS) and ``deny`` (wins) lists of CIDRs or DNS names (resolved when applied). A running
        Environment gets it without a restart; a paused one when it resumes."""
        response = self._client.request(
            "POST",
            f"/v1/environments/{self.id}/network",
            what=f"set network of {self.id}",
            idempotent=True,
            json=network_body(mode, allow, deny),
        )
        self._apply(response.json())
        return self

    def stats(self) -> EnvironmentStats:
        """CPU, memory and disk usage of the running Environment, from its node's last sample (``sample_age_seconds``
        says how old). A paused Environment is not woken: EnvironmentPausedError."""
        response = self._client.request(
            "GET", f"/v1/environments/{self.id}/stats", what=f"stats of {self.id}", idempotent=True
        )
        return EnvironmentStats.model_validate(response.json())

    def logs(
        self,
        *,
        tail: int | None = None,
        since: datetime | None = None,
        cursor: str | None = None,
        limit: int = 1000,
        wait_seconds: float = 0.0,
    ) -> EnvironmentLogs:
        """One page of the workload's stdout and stderr (every execution: a restart continues the log), oldest
        first: from the oldest kept line, the last ``tail`` lines, lines read since ``since``, or those after
        ``cursor`` (from an earlier page). ``wait_seconds``: wait that long for a new line. A paused Environment's
        logs are read without waking it."""
        params = logs_params(tail=tail, since=since, cursor=cursor, limit=limit, wait_seconds=wait_seconds)
        response = self._client.request(
            "GET",
            f"/v1/environments/{self.id}/logs",
            what=f"logs of {self.id}",
            idempotent=True,
            params=params,
            timeout=self._client.timeout + wait_seconds,
        )
        return EnvironmentLogs.model_validate(response.json())

    def follow_logs(self, *, tail: int | None = None, since: datetime | None = None) -> Iterator[LogEntry]:
        """Every line as it is written (``tail``/``since`` choose where to start), until the caller stops
        iterating. Long polls with the page cursor: a dropped connection loses and repeats nothing."""
        page = self.logs(tail=tail, since=since)
        while True:
            yield from page.lines
            page = self.logs(cursor=page.cursor or None, since=since, wait_seconds=FOLLOW_WAIT_SECONDS)

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
    ) -> Pty:
        """``with env.pty() as term:`` a login shell (or ``command``) on a pseudo-terminal; see :class:`Pty`."""
        body = pty_body(command, PtySize(rows, cols), env=env, cwd=cwd, timeout=timeout, term=term)
        return Pty(self._client, self.id, CommandStream(self._client, self.id, body, FrameReader()))

    def wait_until_running(self, timeout: float = 120.0) -> Environment:
        """Wait until ``running``; WaitTimeoutError after ``timeout`` s, ConflictError if it failed or is deleted.
        The server waits (``?wait=running``): the answer comes as the start is committed, not at a poll."""
        return self._wait_running(RunningWait(timeout))

    def _wait_running(self, running: RunningWait) -> Environment:
        while self.state is not EnvironmentState.RUNNING:
            check_waitable(self)
            pause = running.pause(self)
            if pause:
                time.sleep(pause)
            try:
                response = self._client.request(
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


class CommandStream(AbstractContextManager["CommandStream"]):
    """``with env.commands.stream("make") as run: for chunk in run: ...``; then ``run.result``."""

    def __init__(self, client: Client, environment_id: str, body: dict[str, Any], reader: FrameReader) -> None:
        self._client = client
        self._path = f"/v1/environments/{environment_id}/commands"
        self._body = body
        self._reader = reader
        self._response: httpx.Response | None = None
        self._line_iter: Iterator[str] | None = None

    def __enter__(self) -> CommandStream:
        what = "run command"
        # No read timeout: a command may be quiet for a long time (its own timeout bounds it).
        timeout = httpx.Timeout(DEFAULT_TIMEOUT, read=None)
        for attempt in range(self._client.retries + 1):
            request = self._client._http.build_request("POST", self._path, json=self._body, timeout=timeout)
            try:
                response = self._client._http.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Never sent: safe to try again. Anything later is not retried (a command is not idempotent).
                if attempt == self._client.retries:
                    raise transport_error(exc, what, sent=False) from None
                time.sleep(backoff(attempt))
                continue
            except httpx.HTTPError as exc:
                raise transport_error(exc, what, sent=True) from None
            if response.status_code != 200:
                body = response.read()
                response.close()
                raise error_from_response("POST", response.status_code, body, what, self._client.api_url)
            self._response = response
            return self
        raise AssertionError("unreachable")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._response is not None:
            self._response.close()  # hanging up kills a still-running foreground command

    def _lines(self) -> Iterator[str]:
        if self._response is None:
            raise AdxError("use the stream inside a with block")
        if self._line_iter is None:  # one iterator: started() and __iter__ read the same lines in turn
            self._line_iter = self._response.iter_lines()
        return self._line_iter

    def started(self) -> str:
        """Read up to the start frame (always the first) and answer the command's ID; no output is skipped."""
        try:
            for line in self._lines():
                self._reader.feed(line)
                if self._reader.id:
                    break
        except httpx.HTTPError as exc:
            raise transport_error(exc, "run command", sent=True) from None
        return self._reader.id

    @property
    def finished(self) -> bool:
        """The exit frame was read."""
        return self._reader.final is not None

    def __iter__(self) -> Iterator[OutputChunk]:
        # Lines come from one iterator: a loop that stopped early (env.pty() reads up to a prompt) and iterates
        # again goes on where it stopped.
        try:
            for line in self._lines():
                chunk = self._reader.feed(line)
                if chunk is not None:
                    yield chunk
        except httpx.HTTPError as exc:
            raise transport_error(exc, "run command", sent=True) from None

    @property
    def result(self) -> CommandResult:
        for _ in self:
            pass
        return self._reader.result()


class Commands:
    def __init__(self, client: Client, environment: Environment) -> None:
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
    ) -> CommandStream:
        body = command_body(
            command if isinstance(command, str) else list(command),
            env=dict(env) if env else None,
            cwd=cwd,
            timeout=timeout,
            stdin=stdin,
        )
        return CommandStream(self._client, self._environment.id, body, FrameReader(on_stdout, on_stderr))

    def run(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
    ) -> CommandResult:
        """Run ``command`` (a shell string, or an argv list) and wait for it. ``on_stdout``/``on_stderr`` get
        output as it is produced. A non-zero exit is a result, not an error; so is a program that does not
        exist (127) or cannot be executed (126), as from a shell."""
        try:
            with self.stream(
                command, env=env, cwd=cwd, timeout=timeout, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr
            ) as running:
                return running.result
        except InvalidInputError as exc:
            result = not_started(exc, command, on_stderr)
            if result is None:
                raise
            return result


class Files:
    def __init__(self, client: Client, environment: Environment) -> None:
        self._client = client
        self._environment = environment

    def _path(self, suffix: str = "") -> str:
        return f"/v1/environments/{self._environment.id}/files{suffix}"

    def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        params = {"path": check_path(path)}
        if mode is not None:
            params["mode"] = f"{mode:o}"
        content = data.encode() if isinstance(data, str) else bytes(data)
        self._client.request("PUT", self._path(), what=f"write {path}", idempotent=True, params=params, content=content)

    def read(self, path: str) -> bytes:
        response = self._client.request(
            "GET", self._path(), what=f"read {path}", idempotent=True, params={"path": check_path(path)}
        )
        return response.content

    def delete(self, path: str) -> None:
        self._client.request(
            "DELETE", self._path(), what=f"delete {path}", idempotent=True, params={"path": check_path(path)}
        )

    def stat(self, path: str) -> dict[str, Any]:
        response = self._client.request(
            "GET", self._path("/stat"), what=f"stat {path}", idempotent=True, params={"path": check_path(path)}
        )
        result: dict[str, Any] = response.json()
        return result

    def list(self, path: str) -> builtins.list[dict[str, Any]]:
        response = self._client.request(
            "GET", self._path("/list"), what=f"list {path}", idempotent=True, params={"path": check_path(path)}
        )
        entries: builtins.list[dict[str, Any]] = response.json()["entries"]
        return entries

    def mkdir(self, path: str) -> None:
        self._client.request(
            "POST", self._path("/mkdir"), what=f"mkdir {path}", idempotent=True, params={"path": check_path(path)}
        )
