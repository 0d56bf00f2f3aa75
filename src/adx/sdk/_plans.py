"""The Environment operations of both clients as plans (see ``adx.sdk._calls``): each builds its requests,
decides what to do with the answers and parses them once; ``Client`` and ``AsyncClient`` only carry them out."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar, cast

import httpx

from adx.errors import InvalidInputError, NoCapacityError
from adx.errors import WaitTimeoutError as StateWaitTimeoutError
from adx.model import EnvironmentLogs, EnvironmentState, EnvironmentStats, IdleAction
from adx.sdk._calls import DEFAULT_TIMEOUT, C, Call, CapacityWait, ClientCore, Plan, Sleep, json_of, request
from adx.sdk._errors import transport_error
from adx.sdk._logs import LogsQuery, logs_params
from adx.sdk._models import (
    CommandBody,
    CommandOptions,
    CommandResult,
    EnvironmentFields,
    FrameReader,
    check_keywords,
    check_path,
    command_parts,
    not_started,
)
from adx.sdk._spec import RESUME_TIMEOUT_SECONDS, SpecArgs, build_spec, lifetime_body, network_body
from adx.sdk._spec import pause_call_timeout as _pause_call_timeout
from adx.sdk._wait import RunningWait, check_waitable

E = TypeVar("E", bound=EnvironmentFields)

ENVIRONMENTS = "/v1/environments"


class CreateArgs(SpecArgs, total=False):
    """``environments.create(**)``: the spec's arguments, and how to wait for the Environment."""

    wait: bool | float  # until running (default True); SECONDS: also for capacity that long
    wait_timeout: float  # for running (default 120 s)
    idempotency_key: str | None  # a fresh one unless given


_WAITING = ("wait", "wait_timeout", "idempotency_key")


def create(client: ClientCore, make: Callable[[Any], E], args: CreateArgs) -> Plan[E]:
    """``environments.create``: the spec checked before any request, sent with an Idempotency-Key (so retries
    after a lost reply never create two), again after the server's Retry-After while ``wait=SECONDS`` waits for
    capacity, then waited for until running (``wait``)."""
    check_keywords("create", args, CreateArgs)
    wait, wait_timeout = args.get("wait", True), args.get("wait_timeout", 120.0)
    capacity = CapacityWait(wait)
    body = build_spec(**cast(SpecArgs, {name: v for name, v in args.items() if name not in _WAITING}))
    key = args.get("idempotency_key") or str(uuid.uuid4())
    while True:
        # Counted from the create that is taken: a wait for capacity before it does not shorten it.
        running = RunningWait(wait_timeout) if wait is not False else None
        call = Call(
            "POST",
            ENVIRONMENTS,
            what="create environment",
            idempotent=True,
            json=body,
            headers={"Idempotency-Key": key},
            # The server answers once it runs (the rest of the wait, if any, below).
            params=running.params() if running else None,
            timeout=running.call_timeout(client.timeout) if running else None,
        )
        try:
            data = yield from json_of(client, call)
            break
        except NoCapacityError as refused:
            yield Sleep(capacity.delay(refused))
    environment = make(data)
    if running is not None:
        yield from wait_running(client, environment, running)
    return environment


def wait_running(client: ClientCore, env: EnvironmentFields, running: RunningWait) -> Plan[None]:
    """Until ``env`` is running: the server waits (``?wait=running``), a server that does not is polled."""
    while env.state is not EnvironmentState.RUNNING:
        check_waitable(env)
        pause = running.pause(env)
        if pause:
            yield Sleep(pause)
        call = Call(
            "GET",
            f"{ENVIRONMENTS}/{env.id}",
            what=f"wait for {env.id} to run",
            idempotent=True,
            params=running.params(),
            timeout=running.call_timeout(client.timeout),
        )
        try:
            data = yield from json_of(client, call)
        except StateWaitTimeoutError:
            continue  # the server's wait ended first; ours may go on
        env._apply(data)
        running.answered(env)


def get(client: ClientCore, environment_id: str) -> Plan[Any]:
    path = f"{ENVIRONMENTS}/{environment_id}"
    return json_of(client, Call("GET", path, what=f"get {environment_id}", idempotent=True))


def listed(client: ClientCore) -> Plan[list[Any]]:
    data = yield from json_of(client, Call("GET", ENVIRONMENTS, what="list environments", idempotent=True))
    return list(data["environments"])


def delete(client: ClientCore, environment_id: str) -> Plan[Any]:
    path = f"{ENVIRONMENTS}/{environment_id}"
    return json_of(client, Call("DELETE", path, what=f"delete {environment_id}", idempotent=True))


def _action(client: ClientCore, env: EnvironmentFields, action: str, what: str, **options: Any) -> Plan[Any]:
    """``POST .../{id}/{action}`` (idempotent: each sets a state), its answer the Environment's new fields."""
    path = f"{ENVIRONMENTS}/{env.id}/{action}"
    return json_of(client, Call("POST", path, what=f"{what} {env.id}", idempotent=True, **options))


def pause(client: ClientCore, env: EnvironmentFields) -> Plan[Any]:
    return _action(client, env, "pause", "pause", timeout=_pause_call_timeout(env.lifecycle, client.timeout))


def resume(client: ClientCore, env: EnvironmentFields) -> Plan[Any]:
    return _action(client, env, "resume", "resume", timeout=max(client.timeout, RESUME_TIMEOUT_SECONDS))


def set_lifetime(
    client: ClientCore, env: EnvironmentFields, seconds: float, action: IdleAction | str | None
) -> Plan[Any]:
    return _action(client, env, "lifetime", "set lifetime of", json=lifetime_body(seconds, action))


def set_network(client: ClientCore, env: EnvironmentFields, mode: str, allow: Any, deny: Any) -> Plan[Any]:
    return _action(client, env, "network", "set network of", json=network_body(mode, allow, deny))


def stats(client: ClientCore, environment_id: str) -> Plan[EnvironmentStats]:
    path = f"{ENVIRONMENTS}/{environment_id}/stats"
    data = yield from json_of(client, Call("GET", path, what=f"stats of {environment_id}", idempotent=True))
    return EnvironmentStats.model_validate(data)


def logs(client: ClientCore, environment_id: str, query: LogsQuery) -> Plan[EnvironmentLogs]:
    call = Call(
        "GET",
        f"{ENVIRONMENTS}/{environment_id}/logs",
        what=f"logs of {environment_id}",
        idempotent=True,
        params=logs_params(**query),
        timeout=client.timeout + query.get("wait_seconds", 0.0),
    )
    data = yield from json_of(client, call)
    return EnvironmentLogs.model_validate(data)


def run_command(environment_id: str, body: CommandBody) -> Call:
    """Starting a command: its answer is the stream of output frames. A command is not idempotent: only a
    request that never left is sent again. No read timeout: a command may be quiet for a long time (its own
    timeout bounds it)."""
    path = f"{ENVIRONMENTS}/{environment_id}/commands"
    timeout = httpx.Timeout(DEFAULT_TIMEOUT, read=None)
    return Call("POST", path, what="run command", idempotent=False, json=body, timeout=timeout, stream=True)


class FilesCore(Generic[C]):
    """``env.files``' operations (plans, carried out by each face): every one names an absolute path inside the
    Environment and is idempotent."""

    def __init__(self, client: C, environment: EnvironmentFields) -> None:
        self._client = client
        self._base = f"{ENVIRONMENTS}/{environment.id}/files"

    def _send(self, method: str, suffix: str, path: str, what: str, **options: Any) -> Plan[httpx.Response]:
        params = {"path": check_path(path), **options.pop("params", {})}
        call = Call(method, self._base + suffix, what=f"{what} {path}", idempotent=True, params=params, **options)
        return request(self._client, call)

    def _write(self, path: str, data: bytes | str, mode: int | None) -> Plan[None]:
        check_path(path)  # named before the data is looked at
        content = data.encode() if isinstance(data, str) else bytes(data)
        params = {"mode": f"{mode:o}"} if mode is not None else {}
        yield from self._send("PUT", "", path, "write", params=params, content=content)

    def _read(self, path: str) -> Plan[bytes]:
        response = yield from self._send("GET", "", path, "read")
        return response.content

    def _delete(self, path: str) -> Plan[None]:
        yield from self._send("DELETE", "", path, "delete")

    def _stat(self, path: str) -> Plan[dict[str, Any]]:
        response = yield from self._send("GET", "/stat", path, "stat")
        result: dict[str, Any] = response.json()
        return result

    def _list(self, path: str) -> Plan[list[dict[str, Any]]]:
        response = yield from self._send("GET", "/list", path, "list")
        entries: list[dict[str, Any]] = response.json()["entries"]
        return entries

    def _mkdir(self, path: str) -> Plan[None]:
        yield from self._send("POST", "/mkdir", path, "mkdir")


class CommandsCore(Generic[C]):
    """What both faces' ``env.commands`` share: a command's run request and output reader, and the shell's
    answer for a program that could not start."""

    def __init__(self, client: C, environment: EnvironmentFields) -> None:
        self._client = client
        self._environment_id = environment.id

    def _parts(self, command: str | Sequence[str], options: CommandOptions) -> tuple[str, CommandBody, FrameReader]:
        return (self._environment_id, *command_parts(command, options))

    @staticmethod
    def _not_started(exc: InvalidInputError, command: str | Sequence[str], options: CommandOptions) -> CommandResult:
        return not_started(exc, command, options.get("on_stderr"))


class CommandOutput(Generic[C]):
    """What both faces' command streams share: the request that opens the stream and the frames read so far."""

    def __init__(self, client: C, environment_id: str, body: CommandBody, reader: FrameReader) -> None:
        self._client = client
        self._call = run_command(environment_id, body)
        self._reader = reader
        self._response: httpx.Response | None = None

    @property
    def finished(self) -> bool:
        """The exit frame was read."""
        return self._reader.final is not None


@contextmanager
def reading_output() -> Iterator[None]:
    """Reading a command's output: a transport failure then leaves its outcome unknown (it may have run)."""
    try:
        yield
    except httpx.HTTPError as exc:
        raise transport_error(exc, "run command", sent=True) from None
