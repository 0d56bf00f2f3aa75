"""``adx coordinator``: stand by until this replica holds the leader lease, then load caches from Redis and
serve gRPC with mutual TLS until stopped or until the lease is lost (then stand by again).

Several replicas may run against one Redis; exactly one is active (``_lease``). A standby does not listen on
the gRPC port at all, so clients (``adx._coordinator_channel``) find the active one by trying the addresses.
A replica that loses its lease (frozen past the TTL, cut off from Redis, or fenced by Redis on a write)
stops its gRPC server at once, drops its caches and goes back to standing by; a later term starts from a fresh
load of Redis (CRD-2). Between losing the lease and noticing, every call is refused with UNAVAILABLE
("standby") and every write is refused by Redis itself (fencing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from adx._certs import Identity, component_paths
from adx._grpc_errors import CODE_KEY
from adx._grpc_tls import channel_credentials, server_credentials
from adx._health import HealthServicer
from adx._node_client import NodeClients
from adx.config import CoordinatorConfig
from adx.coordinator._admin_service import CoordinatorAdminService
from adx.coordinator._cache import CoordinatorCache
from adx.coordinator._lease import LeaderLease
from adx.coordinator._service import CoordinatorService
from adx.coordinator._snapshot_service import CoordinatorSnapshotsService
from adx.coordinator._store import CoordinatorStore
from adx.coordinator._token_service import TOKEN_SWEEP_SECONDS, CoordinatorTokensService
from adx.errors import UnavailableError
from adx.proto import coordinator_pb2_grpc, health_pb2_grpc, snapshots_pb2_grpc, tokens_pb2_grpc

log = logging.getLogger("adx.coordinator")


class ListenError(UnavailableError):
    """The gRPC port cannot be bound: a deployment fault, fatal for the daemon."""


#: The error code of a call refused because this replica is not (or no longer) the active one. Clients treat
#: it as "never processed": they try the next address.
STANDBY_CODE = "standby"

#: Clients ping every second to find a frozen (SIGSTOPped) replica behind an open TCP port; allow it.
SERVER_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 500),
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
]


if TYPE_CHECKING:  # generic in the type stubs only
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor


class _ActiveOnly(_Interceptor):
    """Refuse every call once the lease no longer vouches for this replica (e.g. right after SIGCONT)."""

    def __init__(self, lease: LeaderLease) -> None:
        self._lease = lease

        async def refuse(request: object, context: grpc.aio.ServicerContext[object, object]) -> None:
            context.set_trailing_metadata(((CODE_KEY, STANDBY_CODE),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "standby: this Coordinator replica is not the active one")

        self._refuse = grpc.unary_unary_rpc_method_handler(refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if self._lease.held():
            return await continuation(handler_call_details)
        return self._refuse


@dataclass
class RunningCoordinator:
    server: grpc.aio.Server
    store: CoordinatorStore
    service: CoordinatorService
    health: HealthServicer
    port: int
    scans: asyncio.Task[None]
    stop_scans: asyncio.Event
    lease: LeaderLease
    keeper: asyncio.Task[None]
    token_sweeps: asyncio.Task[None] | None = None  # SEC-4: deleted Environments' endpoint tokens reclaimed

    async def stop(self, grace: float | None = 5.0, *, release: bool = True) -> None:
        """End this term. ``release``: give the lease up so a standby takes over at once (a clean stop)."""
        self.health.set_not_serving("stopping")
        self.stop_scans.set()
        for task in (self.scans, self.token_sweeps):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.server.stop(grace)
        if self.service.nodes is not None:
            await self.service.nodes.close()
        await self.store.close()
        self.keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.keeper
        if release:
            await self.lease.release()
        await self.lease.close()


def new_lease(config: CoordinatorConfig) -> LeaderLease:
    return LeaderLease(config.redis_url, ttl=config.leader_lease_seconds, redis_timeout=config.redis_timeout_seconds)


async def start_coordinator(config: CoordinatorConfig, *, lease: LeaderLease | None = None) -> RunningCoordinator:
    """Serve one term. Without ``lease``, campaign for one first (waits while another replica is active)."""
    if lease is None:
        lease = new_lease(config)
        try:
            await lease.campaign(asyncio.Event())
        except BaseException:
            await lease.close()
            raise
    assert lease.value is not None
    paths = component_paths(config.certs_dir, Identity("coordinator", config.name))
    credentials = server_credentials(paths)
    store = CoordinatorStore.from_url(
        config.redis_url,
        timeout=config.redis_timeout_seconds,
        wait_replicas=config.redis_wait_replicas,
        wait_timeout=config.redis_wait_timeout_seconds,
    )
    store.fence_with(lease.value, lambda holder: lease.mark_lost(f"Redis refused a write: the lease is {holder!r}"))
    try:
        await store.ping()
        cache = await CoordinatorCache.load(store)  # CRD-2: every term starts from the authority
    except BaseException:
        await store.close()
        raise
    nodes = NodeClients(channel_credentials(paths), rpc_timeout=config.node_rpc_timeout_seconds)
    service = CoordinatorService(
        store,
        cache,
        nodes=nodes,
        session_ttl=config.session_ttl_seconds,
        resume_retry_seconds=config.resume_retry_seconds,
    )
    health = HealthServicer("coordinator")
    server = grpc.aio.server(interceptors=[_ActiveOnly(lease)], options=SERVER_OPTIONS)
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(service, server)
    leader = f"replica {lease.replica_id} ({config.name}, {config.listen}, term {lease.value})"
    coordinator_pb2_grpc.add_CoordinatorAdminServicer_to_server(CoordinatorAdminService(service, leader=leader), server)
    tokens = CoordinatorTokensService(service)
    tokens_pb2_grpc.add_CoordinatorTokensServicer_to_server(tokens, server)
    snapshots = CoordinatorSnapshotsService(service)
    snapshots_pb2_grpc.add_CoordinatorSnapshotsServicer_to_server(snapshots, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        port = server.add_secure_port(config.listen, credentials)
    except RuntimeError as exc:
        await store.close()
        await nodes.close()
        raise ListenError(f"coordinator: cannot listen on {config.listen} (listen): {exc}") from None
    await server.start()
    health.set_serving()
    keeper = asyncio.create_task(lease.keep(), name="lease")
    stop_scans = asyncio.Event()
    scans = asyncio.create_task(service.lifecycle.run_scans(config.scan_interval_seconds, stop_scans), name="scans")
    log.info("coordinator active", extra={"listen": config.listen, "port": port, "token": lease.value})
    sweeps = asyncio.create_task(
        _together(
            tokens.run_sweeps(TOKEN_SWEEP_SECONDS, stop_scans),
            snapshots.run_sweeps(config.scan_interval_seconds, stop_scans),
        ),
        name="sweeps",
    )
    return RunningCoordinator(server, store, service, health, port, scans, stop_scans, lease, keeper, sweeps)


async def _together(*sweeps: Coroutine[Any, Any, None]) -> None:
    """The periodic sweeps (endpoint tokens, expired snapshots) as one task that stops with the scans."""
    await asyncio.gather(*sweeps)


async def run_coordinator(config: CoordinatorConfig) -> None:
    """The election loop: campaign, serve while the lease holds, stand by again when it is lost."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        lease = new_lease(config)
        log.info("coordinator standing by", extra={"replica": lease.replica_id, "listen": config.listen})
        if not await lease.campaign(stop):
            await lease.close()
            break
        try:
            running = await start_coordinator(config, lease=lease)
        except ListenError:
            await lease.release()
            await lease.close()
            raise
        except UnavailableError as exc:
            # Redis went away between winning and loading: let another replica (or a later term) try.
            log.warning("coordinator could not start its term: %s", exc)
            await lease.release()
            await lease.close()
            await asyncio.sleep(min(1.0, config.leader_lease_seconds / 3))
            continue
        await _first(stop.wait(), lease.lost.wait())
        if stop.is_set():
            log.info("coordinator stopping")
            await running.stop()
            break
        log.warning("coordinator lost the leader lease: stopped serving, standing by again")
        await running.stop(grace=None, release=False)


async def _first(*waits: Awaitable[Any]) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
