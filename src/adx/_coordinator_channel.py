"""A gRPC channel to whichever of several Coordinator replicas is active (HA; docs/high-availability.md).

``coordinator_channel(targets, credentials)`` returns a ``grpc.aio.Channel``: generated stubs work on it
unchanged. It keeps one mutual-TLS channel per address and sends every call to the replica found active:

- The active replica is found by asking every address's Health service at once; the first that answers
  SERVING (as component "coordinator") wins. A standby does not listen (connection refused), a replica that
  just lost its lease answers UNAVAILABLE "standby", and a frozen (SIGSTOPped) one keeps its TCP port open
  but never answers: the probe's own deadline (``probe_timeout``) skips it.
- A call failing with UNAVAILABLE or DEADLINE_EXCEEDED makes its replica suspect: the next call probes again
  (and skips a frozen replica by the probe's deadline). A call already in flight on a replica that froze ends
  at its own deadline. Connections also ask for keepalive pings every second, but with this grpcio build a
  frozen peer was not detected by them in our tests: deadlines are what bound a call. A stream has no
  deadline: with ``stream_silence_timeout`` a stream that brings nothing for that long (the Coordinator sends
  ``WatchRoutes`` heartbeats every second) ends UNAVAILABLE and its replica is suspect, so the caller's
  reconnect finds the active one; without it, a stream on a frozen replica ends only when that replica stops
  its server (after SIGCONT, or when it dies).
- A failed call is retried on the newly found active replica, within the caller's deadline, only when it
  cannot have been processed (connection refused, refused as "standby", no active replica found) or when it
  is a read (``IDEMPOTENT_METHODS``). A write that failed after it was sent is returned to the caller as is
  (UNAVAILABLE: retry with the same idempotency key) — a client must never apply a write twice.
- A call without a deadline waits up to ``failover_timeout`` for an active replica. With a single address
  there is nobody to wait for: a call fails at once (UNAVAILABLE) when it is not serving.

Streams (``WatchRoutes``) go to the active replica and end with the error when it fails; the caller
reconnects (and resyncs) as before. Targets are ``host:port`` with the certificate names checked as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypedDict, cast

import grpc
from grpc.aio import Metadata

from adx.proto import health_pb2, health_pb2_grpc

__all__ = [
    "CLIENT_OPTIONS",
    "IDEMPOTENT_METHODS",
    "FailoverChannel",
    "FailoverPolicy",
    "coordinator_channel",
    "parse_targets",
]

_SERVICE = "/adx.coordinator.Coordinator/"
#: Calls that change nothing (or set the same state again): safe to send again after a failure mid-call.
IDEMPOTENT_METHODS = frozenset(
    _SERVICE + name
    for name in (
        "Authenticate",
        "GetEnvironment",
        "ListEnvironments",
        "ResolveRoute",
        "InspectNode",
        "Heartbeat",
        "ReportCapacity",
    )
)
#: Keepalive pings (allowed by the Coordinator's server options) and a short reconnect backoff, so a replica
#: that comes back (standby turned active) is dialled again within ~1 s.
CLIENT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_STANDBY_CODE = "standby"  # adx.coordinator._daemon.STANDBY_CODE (the client does not import the server)
_RETRY_PAUSE = 0.1


def parse_targets(targets: str | Sequence[str]) -> tuple[str, ...]:
    """``"a:1,b:2"`` or ``["a:1", "b:2"]`` -> ``("a:1", "b:2")``; ValueError when empty."""
    items = targets.split(",") if isinstance(targets, str) else list(targets)
    parsed = tuple(item.strip() for item in items if item.strip())
    if not parsed:
        raise ValueError("at least one Coordinator address (host:port) is needed")
    return parsed


def coordinator_channel(
    targets: str | Sequence[str],
    credentials: grpc.ChannelCredentials,
    *,
    probe_timeout: float = 1.0,
    failover_timeout: float = 30.0,
    stream_silence_timeout: float | None = None,
) -> FailoverChannel:
    """A ``grpc.aio.Channel`` to the active one of ``targets`` (``"a:1,b:2"`` or a list). Create it inside the
    event loop that uses it (grpc.aio binds to it)."""
    policy = FailoverPolicy(probe_timeout, failover_timeout, stream_silence_timeout)
    return FailoverChannel(parse_targets(targets), credentials, policy)


@dataclass(frozen=True)
class FailoverPolicy:
    """How a FailoverChannel looks for the active replica and what it may send again."""

    #: How long each replica's Health probe may take.
    probe_timeout: float = 1.0
    #: How long a call waits for an active replica to be found.
    failover_timeout: float = 30.0
    #: A server stream silent this long is taken for a frozen replica (None: never).
    stream_silence_timeout: float | None = None
    #: Methods that may be sent again after a failure once they were sent (reads).
    idempotent: frozenset[str] = IDEMPOTENT_METHODS


def _unavailable(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, Metadata(), Metadata(), details, None)


def _never_processed(exc: grpc.aio.AioRpcError) -> bool:
    """The call certainly did not reach a serving Coordinator (so sending it elsewhere cannot apply it twice)."""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    trailing = exc.trailing_metadata()
    if isinstance(trailing, Metadata) and trailing.get("adx-error-code") == _STANDBY_CODE:
        return True
    text = f"{exc.details()} {exc.debug_error_string()}".lower()
    return "failed to connect" in text or "connection refused" in text


class FailoverChannel(grpc.aio.Channel):
    def __init__(
        self,
        targets: tuple[str, ...],
        credentials: grpc.ChannelCredentials,
        policy: FailoverPolicy = FailoverPolicy(),
    ) -> None:
        self.targets = targets
        self._credentials = credentials
        self._policy = policy
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._active: str | None = None
        self._finding: asyncio.Lock | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def active_target(self) -> str | None:
        """The address calls go to now (None: to be found by the next call)."""
        return self._active

    # -- finding the active replica ----------------------------------------------------------------------
    def _channel(self, target: str) -> grpc.aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = grpc.aio.secure_channel(target, self._credentials, options=CLIENT_OPTIONS)
            self._channels[target] = channel
        return channel

    def _drop(self, target: str) -> None:
        """Forget ``target``'s channel: the next attempt connects afresh (no reconnect backoff, no frozen peer)."""
        channel = self._channels.pop(target, None)
        if channel is not None:
            task = asyncio.ensure_future(channel.close(grace=None))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def suspect(self, target: str) -> None:
        """``target`` failed a call: find the active replica again before the next call."""
        if self._active == target:
            self._active = None

    async def _probe(self, target: str, within: float) -> str:
        reply = await health_pb2_grpc.HealthStub(self._channel(target)).Check(
            health_pb2.HealthCheckRequest(), timeout=within
        )
        if reply.status != health_pb2.HealthCheckResponse.SERVING or reply.component != "coordinator":
            raise LookupError(f"{target}: not serving ({reply.detail or reply.component})")
        return target

    async def _probe_all(self, within: float) -> str | None:
        tasks = {asyncio.ensure_future(self._probe(target, within)): target for target in self.targets}
        try:
            for next_done in asyncio.as_completed(tasks):
                with contextlib.suppress(grpc.aio.AioRpcError, LookupError):
                    return await next_done
            return None
        finally:
            for task, target in tasks.items():
                if not task.done():
                    task.cancel()
                elif task.cancelled() or task.exception() is not None:
                    self._drop(target)

    async def _find(self, deadline: float) -> tuple[str, grpc.aio.Channel]:
        if self._closed:
            raise _unavailable("the Coordinator channel is closed")
        if self._finding is None:
            self._finding = asyncio.Lock()
        while self._active is None:
            async with self._finding:  # one probe round at a time; the others use its result
                if self._active is not None:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _unavailable(f"no active Coordinator among {', '.join(self.targets)}")
                self._active = await self._probe_all(min(self._policy.probe_timeout, remaining))
                if self._active is None and len(self.targets) == 1:
                    # No standby can take over: fail at once, as a plain channel to a stopped server would.
                    raise _unavailable(f"the Coordinator at {self.targets[0]} is not serving")
                if self._active is None:
                    await asyncio.sleep(min(_RETRY_PAUSE, max(deadline - time.monotonic(), 0)))
        return self._active, self._channel(self._active)

    # -- calls ----------------------------------------------------------------------------------------------
    async def _unary(self, rpc: _Rpc, request: Any, within: float | None, options: _CallOptions) -> Any:
        deadline = time.monotonic() + (within if within is not None else self._policy.failover_timeout)
        while True:
            target, channel = await self._find(deadline)
            call = channel.unary_unary(rpc.method, rpc.serializer, rpc.deserializer)
            try:
                return await call(request, timeout=max(deadline - time.monotonic(), 0.001), **options)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                self.suspect(target)
                retry = _never_processed(exc) or (
                    rpc.method in self._policy.idempotent and exc.code() == grpc.StatusCode.UNAVAILABLE
                )
                if not retry or time.monotonic() >= deadline:
                    raise

    async def _stream(self, rpc: _Rpc, request: Any, within: float | None, options: _CallOptions) -> AsyncIterator[Any]:
        find_within = within if within is not None else self._policy.failover_timeout
        target, channel = await self._find(time.monotonic() + find_within)
        unary_stream = channel.unary_stream(rpc.method, rpc.serializer, rpc.deserializer)
        stream = unary_stream(request, timeout=within, **options)
        silence = self._policy.stream_silence_timeout
        try:
            while True:
                try:
                    item = await asyncio.wait_for(stream.read(), silence)
                except TimeoutError:
                    self.suspect(target)
                    raise _unavailable(
                        f"no message from Coordinator {target} within {silence:g}s (a frozen replica?)"
                    ) from None
                if item is grpc.aio.EOF:  # type: ignore[attr-defined]  # (missing from the grpc stubs)
                    return
                yield item
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self.suspect(target)
            raise
        finally:
            stream.cancel()

    def unary_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, *_: Any, **__: Any
    ) -> grpc.aio.UnaryUnaryMultiCallable[Any, Any]:
        return _UnaryUnaryCallable(self, _Rpc(method, request_serializer, response_deserializer))

    def unary_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, *_: Any, **__: Any
    ) -> grpc.aio.UnaryStreamMultiCallable[Any, Any]:
        return _UnaryStreamCallable(self, _Rpc(method, request_serializer, response_deserializer))

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> grpc.aio.StreamUnaryMultiCallable[Any, Any]:
        raise NotImplementedError("the Coordinator has no client-streaming methods")

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> grpc.aio.StreamStreamMultiCallable[Any, Any]:
        raise NotImplementedError("the Coordinator has no client-streaming methods")

    # -- channel protocol -------------------------------------------------------------------------------------
    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        if self._active is None:
            return grpc.ChannelConnectivity.IDLE
        return self._channel(self._active).get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        if self._active is None:
            await asyncio.sleep(_RETRY_PAUSE)
            return
        await self._channel(self._active).wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._find(time.monotonic() + self._policy.failover_timeout)

    async def close(self, grace: float | None = None) -> None:
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(grace)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def __aenter__(self) -> FailoverChannel:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> None:
        await self.close(None)


@dataclass(frozen=True)
class _Rpc:
    """A method's full name and its request serializer and response deserializer, as the generated stubs give them."""

    method: str
    serializer: Any
    deserializer: Any


class _CallOptions(TypedDict, total=False):
    """What a call may carry besides its request and deadline; passed on as given to the active replica's channel."""

    metadata: Metadata | Sequence[tuple[str, str | bytes]]
    credentials: grpc.CallCredentials
    wait_for_ready: bool
    compression: grpc.Compression


class _FailoverMethod:
    """One method of a FailoverChannel, as the multi-callable gRPC's generated stubs hold: calling it goes
    through the channel's failover (``_unary`` / ``_stream``)."""

    def __init__(self, owner: FailoverChannel, rpc: _Rpc) -> None:
        self._owner, self._rpc = owner, rpc

    @staticmethod
    def _options(given: Mapping[str, object]) -> _CallOptions:
        # The stubs pass every option, unset ones as None: only those set are passed on.
        return cast(_CallOptions, {k: v for k, v in given.items() if v is not None})


class _UnaryUnaryCallable(_FailoverMethod, grpc.aio.UnaryUnaryMultiCallable[Any, Any]):
    def __call__(  # type: ignore[override]
        self, request: Any, *, timeout: float | None = None, **options: Any
    ) -> _UnaryCall:
        unary = self._owner._unary(self._rpc, request, timeout, self._options(options))
        return _UnaryCall(unary, timeout)


class _UnaryStreamCallable(_FailoverMethod, grpc.aio.UnaryStreamMultiCallable[Any, Any]):
    def __call__(  # type: ignore[override]
        self, request: Any, *, timeout: float | None = None, **options: Any
    ) -> _StreamCall:
        return _StreamCall(self._owner._stream(self._rpc, request, timeout, self._options(options)))


def _metadata(items: Any) -> Metadata:
    return items if isinstance(items, Metadata) else Metadata(*items)


class _CallState:
    """What a finished call reports through the ``grpc.aio.Call`` interface."""

    _error: grpc.aio.AioRpcError | None = None
    _done = False

    def _failure(self) -> grpc.aio.AioRpcError | None:
        return self._error

    async def _finished(self) -> None:
        raise NotImplementedError

    async def code(self) -> grpc.StatusCode:
        await self._finished()
        return self._error.code() if self._error is not None else grpc.StatusCode.OK

    async def details(self) -> str:
        await self._finished()
        return (self._error.details() or "") if self._error is not None else ""

    async def initial_metadata(self) -> Metadata:
        await self._finished()
        return _metadata(self._error.initial_metadata() if self._error is not None else ())

    async def trailing_metadata(self) -> Metadata:
        await self._finished()
        return _metadata(self._error.trailing_metadata() if self._error is not None else ())

    async def wait_for_connection(self) -> None:
        return None


class _UnaryCall(_CallState, grpc.aio.UnaryUnaryCall[Any, Any]):
    """A unary call across replicas: started at once (as grpc.aio calls are), awaited for its response."""

    def __init__(self, work: Awaitable[Any], timeout: float | None) -> None:
        self._task: asyncio.Future[Any] = asyncio.ensure_future(work)
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._task.add_done_callback(self._record)

    def _record(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and isinstance(task.exception(), grpc.aio.AioRpcError):
            self._error = task.exception()  # type: ignore[assignment]

    async def _finished(self) -> None:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(self._task)

    def __await__(self) -> Generator[Any, None, Any]:
        return self._task.__await__()

    def cancelled(self) -> bool:
        return self._task.cancelled()

    def done(self) -> bool:
        return self._task.done()

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def cancel(self) -> bool:
        return self._task.cancel()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._task.add_done_callback(lambda _: callback(self))


class _StreamCall(_CallState, grpc.aio.UnaryStreamCall[Any, Any]):
    """A server stream from the active replica; ends with that replica's error (no resume across replicas)."""

    def __init__(self, stream: AsyncIterator[Any]) -> None:
        self._stream = stream
        self._ended = asyncio.Event()
        self._cancelled = False
        self._callbacks: list[Callable[[Any], None]] = []

    async def _items(self) -> AsyncIterator[Any]:
        try:
            async for item in self._stream:
                yield item
        except grpc.aio.AioRpcError as exc:
            self._error = exc
            raise
        finally:
            self._end()

    def _end(self) -> None:
        if not self._ended.is_set():
            self._ended.set()
            for callback in self._callbacks:
                callback(self)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._items()

    async def read(self) -> Any:
        raise NotImplementedError("iterate the stream instead (async for)")

    async def _finished(self) -> None:
        await self._ended.wait()

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._ended.is_set()

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        if self._ended.is_set():
            return False
        self._cancelled = True
        task = asyncio.ensure_future(self._close_stream())
        task.add_done_callback(lambda _: self._end())
        return True

    async def _close_stream(self) -> None:
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):  # being iterated right now: its reader ends it
                await aclose()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._callbacks.append(callback)
