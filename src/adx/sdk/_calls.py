"""The SDK's sans-I/O core: what to send, when to send it again, and what an answer means, written once for
``adx.Client`` and ``adx.AsyncClient``.

An operation is a *plan*: a generator that yields :class:`Call` (one HTTP attempt) and :class:`Sleep` steps and
returns its result. It never does I/O itself; a face (the sync or the async client) carries out each step with its
own HTTP client and clock and hands the answer back: ``Client.run`` blocks, ``AsyncClient.run`` awaits. So the
request building, the retry rules, the error mapping and the response parsing exist once, and the two faces
differ only in the I/O call (as h11 / httpcore split protocol from transport).
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, NotRequired, TypedDict, TypeVar

import httpx

from adx._backoff import capped_exponential
from adx.errors import InvalidInputError, NoCapacityError
from adx.sdk._errors import error_code, error_from_response, transport_error
from adx.sdk._settings import resolve

T = TypeVar("T")

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


def call_timeout(seconds: float | None) -> Any:
    """A per-call httpx timeout (None: the client's own). Connecting never waits longer than 10 s."""
    if seconds is None:
        return httpx.USE_CLIENT_DEFAULT
    return httpx.Timeout(seconds, connect=min(seconds, 10.0))


class CallOptions(TypedDict):
    """``Client.request``'s keyword arguments (the fields of a :class:`Call` after method and path)."""

    what: str  # what the call does, for error messages ("pause env-1")
    idempotent: bool  # repeating it is harmless: also retried after it may have reached the server
    params: NotRequired[Mapping[str, str] | None]
    json: NotRequired[Any]
    content: NotRequired[bytes | None]
    headers: NotRequired[Mapping[str, str] | None]
    timeout: NotRequired[float | None]  # seconds for this call (None: the client's own)


@dataclass(frozen=True)
class Call:
    """One API request, as data. ``stream``: the answer's body is read by the caller (a command's output)."""

    method: str
    path: str
    what: str
    idempotent: bool
    params: Mapping[str, str] | None = None
    json: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None
    timeout: float | httpx.Timeout | None = None
    stream: bool = False

    def build(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        timeout = self.timeout if isinstance(self.timeout, httpx.Timeout) else call_timeout(self.timeout)
        return http.build_request(
            self.method,
            self.path,
            params=self.params,
            json=self.json,
            content=self.content,
            headers=self.headers,
            timeout=timeout,
        )

    def accepts(self, status: int) -> bool:
        """An answer to hand back as the result: a stream only when it is the 200 that carries the output."""
        return status == 200 if self.stream else status < 400


@dataclass(frozen=True)
class Sleep:
    seconds: float


Step = Call | Sleep
#: A plan yields steps, is sent each Call's ``httpx.Response`` (or has its ``httpx.HTTPError`` thrown in) and
#: returns its result.
Plan = Generator[Step, Any, T]


class Steps(Generic[T]):
    """A plan being carried out: iterate for the steps; set ``reply`` (or ``error``) after each Call; then
    ``result``. The faces' ``run`` is this loop with their own send and sleep."""

    def __init__(self, plan: Plan[T]) -> None:
        self._plan = plan
        self.reply: httpx.Response | None = None
        self.error: httpx.HTTPError | None = None
        self._result: T

    def __iter__(self) -> Steps[T]:
        return self

    def __next__(self) -> Step:
        reply, error = self.reply, self.error
        self.reply = self.error = None
        try:
            return self._plan.throw(error) if error is not None else self._plan.send(reply)
        except StopIteration as done:
            self._result = done.value
            raise StopIteration from None

    @property
    def result(self) -> T:
        return self._result


class ClientCore:
    """What both clients hold: where the API is, its key, and the retry and timeout settings plans read. A face
    opens its own HTTP client and resources in ``_open``."""

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
        headers = {"Authorization": f"Bearer {settings.api_key}", "User-Agent": USER_AGENT}
        self._open(headers, httpx.Timeout(timeout, connect=min(timeout, 10.0)))

    def _open(self, headers: dict[str, str], timeout: httpx.Timeout) -> None:
        raise NotImplementedError


#: The client a face's resource carries its plans out with (``Client`` or ``AsyncClient``).
C = TypeVar("C", bound=ClientCore)


def request(client: ClientCore, call: Call) -> Plan[httpx.Response]:
    """``call`` with bounded retries: a request that never left is always retried; one that may have reached
    the server only when repeating it is harmless (``idempotent``). Answers >= 400 raise the ``adx.errors``
    family the server named."""
    for attempt in range(client.retries + 1):
        last = attempt == client.retries
        refused: httpx.Response | None = None
        try:
            response: httpx.Response = yield call
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            if last:
                raise transport_error(exc, call.what, sent=False) from None
        except httpx.HTTPError as exc:
            if last or not call.idempotent:
                raise transport_error(exc, call.what, sent=True) from None
        else:
            if call.accepts(response.status_code):
                return response
            retry = call.idempotent and response.status_code in RETRY_STATUSES and not last
            if not retry or error_code(response.content) in NOT_RETRIED:
                status, body = response.status_code, response.content
                raise error_from_response(call.method, status, body, call.what, client.api_url)
            refused = response
        yield Sleep(retry_delay(attempt, refused))
    raise AssertionError("unreachable")


def json_of(client: ClientCore, call: Call) -> Plan[Any]:
    """``call``'s answer as JSON."""
    response = yield from request(client, call)
    return response.json()


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
