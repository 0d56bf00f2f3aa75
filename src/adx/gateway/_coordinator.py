"""The API server's client of the Coordinator: mutual TLS as ``api:<name>``, errors translated to adx.errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from adx._certs import Identity, component_paths
from adx._coordinator_channel import coordinator_channel
from adx._grpc_errors import from_rpc_error
from adx._grpc_tls import channel_credentials
from adx.errors import AdxError, AuthenticationError, UnavailableError, UncertainOutcomeError
from adx.gateway._config import ApiConfig
from adx.model import EnvironmentRecord, EnvironmentSpec, NetworkPolicy, parse_wire
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc as pb_grpc
from adx.proto import snapshots_pb2_grpc, tokens_pb2_grpc

R = TypeVar("R")
Req = TypeVar("Req", bound=Message)


class _EnvironmentReply(Protocol):
    """The replies that carry an Environment's record (as JSON)."""

    @property
    def environment_json(self) -> str: ...


Rep = TypeVar("Rep", bound=_EnvironmentReply)

#: A route stream that brings nothing (not even the Coordinator's heartbeat, one a second) for this long is on
#: a frozen replica: it ends, and the reconnect looks for the active one.
ROUTE_STREAM_SILENCE_SECONDS = 5.0


@dataclass(frozen=True)
class Route:
    record: EnvironmentRecord
    relay_address: str  # empty: no node owns it now
    node_address: str = ""  # the owning node's gRPC API (CRD-1)


def _record(text: str) -> EnvironmentRecord:
    return parse_wire(EnvironmentRecord, json.loads(text), "environment")


class CoordinatorClient:
    """One gRPC channel to the Coordinator (to the active one of its replicas: ``adx._coordinator_channel``).
    Create it inside the event loop that uses it (grpc.aio binds to it)."""

    def __init__(
        self,
        target: str | Sequence[str],
        credentials: grpc.ChannelCredentials,
        *,
        timeout: float,
        create_timeout: float,
        pause_timeout: float = 3700.0,
    ):
        self._channel = coordinator_channel(target, credentials, stream_silence_timeout=ROUTE_STREAM_SILENCE_SECONDS)
        self._stub = pb_grpc.CoordinatorStub(self._channel)
        self._timeout = timeout
        self._create_timeout = create_timeout
        self._pause_timeout = pause_timeout

    @classmethod
    def from_config(cls, config: ApiConfig) -> CoordinatorClient:
        paths = component_paths(config.certs_dir, Identity("api", config.name))
        return cls(
            config.coordinator,
            channel_credentials(paths),
            timeout=config.coordinator_timeout_seconds,
            create_timeout=config.create_timeout_seconds,
        )

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def _call(self, what: str, call: Callable[[], Awaitable[R]], *, reads: bool) -> R:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                # The Coordinator refused *our* certificate: a deployment fault, never the caller's input.
                raise UnavailableError(
                    f"{what}: the Coordinator refused the API server's certificate: {exc.details()}"
                ) from None
            error: AdxError = from_rpc_error(exc, f"coordinator {what}")
            if reads and isinstance(error, UncertainOutcomeError):
                # A read that timed out changed nothing: it is simply unavailable now.
                error = UnavailableError(error.message)
            raise error from None

    async def _record_call(
        self,
        what: str,
        rpc: grpc.aio.UnaryUnaryMultiCallable[Req, Rep],
        request: Req,
        rpc_timeout: float,
        *,
        reads: bool,
    ) -> EnvironmentRecord:
        """``_call`` of ``rpc(request)``, for the RPCs that answer with an Environment's record."""
        reply = await self._call(what, lambda: rpc(request, timeout=rpc_timeout), reads=reads)
        return _record(reply.environment_json)

    @property
    def admin(self) -> pb_grpc.CoordinatorAdminAsyncStub:
        """The admin service on the same channel (adx.api's admin routes)."""
        return pb_grpc.CoordinatorAdminStub(self._channel)

    @property
    def tokens(self) -> tokens_pb2_grpc.CoordinatorTokensAsyncStub:
        """The endpoint-token service on the same channel (SEC-4: adx.api's token routes, the Ingress's check)."""
        return tokens_pb2_grpc.CoordinatorTokensStub(self._channel)

    @property
    def snapshots(self) -> snapshots_pb2_grpc.CoordinatorSnapshotsAsyncStub:
        """The snapshot service on the same channel (adx.e2b's snapshot and fork routes)."""
        return snapshots_pb2_grpc.CoordinatorSnapshotsStub(self._channel)

    async def call(self, what: str, call: Callable[[], Awaitable[R]], *, reads: bool) -> R:
        """One call with this client's error translation (for the admin stub's calls)."""
        return await self._call(what, call, reads=reads)

    async def create_tenant(self, name: str) -> str:
        reply = await self._call(
            "create tenant",
            lambda: self._stub.CreateTenant(pb.CreateTenantRequest(name=name), timeout=self._timeout),
            reads=False,
        )
        return str(reply.api_key)

    async def authenticate(self, api_key: str) -> str:
        """The key's tenant; AuthenticationError when that tenant is disabled (NotFoundError: unknown key)."""
        reply = await self._call(
            "authenticate",
            lambda: self._stub.Authenticate(pb.AuthenticateRequest(api_key=api_key), timeout=self._timeout),
            reads=True,
        )
        if reply.disabled:
            raise AuthenticationError(
                "Authorization", f"tenant {reply.tenant} is disabled; an admin can enable it (`adx tenant enable`)"
            )
        return str(reply.tenant)

    async def create_environment(
        self, tenant: str, spec: EnvironmentSpec, idempotency_key: str | None
    ) -> tuple[EnvironmentRecord, bool]:
        request = pb.CreateEnvironmentRequest(
            tenant=tenant, spec_json=spec.model_dump_json(by_alias=True), idempotency_key=idempotency_key or ""
        )
        reply = await self._call(
            "create environment",
            lambda: self._stub.CreateEnvironment(request, timeout=self._create_timeout),
            reads=False,
        )
        return _record(reply.environment_json), bool(reply.created)

    async def get_environment(self, tenant: str, environment_id: str) -> EnvironmentRecord:
        request = pb.EnvironmentRequest(tenant=tenant, environment_id=environment_id)
        return await self._record_call("get environment", self._stub.GetEnvironment, request, self._timeout, reads=True)

    async def list_environments(self, tenant: str) -> list[EnvironmentRecord]:
        request = pb.ListEnvironmentsRequest(tenant=tenant)
        reply = await self._call(
            "list environments", lambda: self._stub.ListEnvironments(request, timeout=self._timeout), reads=True
        )
        return [_record(text) for text in reply.environment_json]

    async def delete_environment(self, tenant: str, environment_id: str) -> EnvironmentRecord:
        request = pb.EnvironmentRequest(tenant=tenant, environment_id=environment_id)
        rpc = self._stub.DeleteEnvironment
        return await self._record_call("delete environment", rpc, request, self._create_timeout, reads=False)

    async def pause_environment(self, tenant: str, environment_id: str) -> EnvironmentRecord:
        """Returns once the checkpoint is published and the pause committed; ConflictError if not running."""
        request = pb.EnvironmentRequest(tenant=tenant, environment_id=environment_id)
        rpc = self._stub.PauseEnvironment
        return await self._record_call("pause environment", rpc, request, self._pause_timeout, reads=False)

    async def ensure_running(self, tenant: str, environment_id: str, timeout: float) -> Route:  # noqa: ASYNC109
        """CRD-5: the Running record (resumed first if it was paused) and its Relay."""
        request = pb.EnsureRunningRequest(tenant=tenant, environment_id=environment_id, timeout_seconds=timeout)
        reply = await self._call(
            "ensure running",
            lambda: self._stub.EnsureRunning(request, timeout=timeout + self._timeout),
            reads=False,
        )
        return Route(_record(reply.environment_json), str(reply.relay_address), str(reply.node_address))

    async def set_lifetime(
        self, tenant: str, environment_id: str, seconds: float, action: str = ""
    ) -> EnvironmentRecord:
        """Move the lifetime deadline to now + ``seconds``; ``action`` "delete" | "pause" | "" (unchanged)."""
        request = pb.SetLifetimeRequest(tenant=tenant, environment_id=environment_id, seconds=seconds, action=action)
        return await self._record_call("set lifetime", self._stub.SetLifetime, request, self._timeout, reads=False)

    async def set_network(self, tenant: str, environment_id: str, network: NetworkPolicy) -> EnvironmentRecord:
        """Store a new network policy (a spec revision); the owning node applies it in place."""
        request = pb.SetNetworkRequest(
            tenant=tenant, environment_id=environment_id, network_json=network.model_dump_json(by_alias=True)
        )
        return await self._record_call("set network", self._stub.SetNetwork, request, self._timeout, reads=False)

    async def watch_routes(self) -> AsyncIterator[pb.RouteEvent]:
        """The Coordinator's route publications; ends (raises) when the stream breaks."""
        stream = self._stub.WatchRoutes(pb.WatchRoutesRequest())
        try:
            async for event in stream:
                if not event.heartbeat:
                    yield event
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, "watch routes") from None
        finally:
            stream.cancel()

    async def resolve_route(self, tenant: str, environment_id: str) -> Route:
        request = pb.EnvironmentRequest(tenant=tenant, environment_id=environment_id)
        reply = await self._call(
            "resolve route", lambda: self._stub.ResolveRoute(request, timeout=self._timeout), reads=True
        )
        return Route(_record(reply.environment_json), str(reply.relay_address), str(reply.node_address))
