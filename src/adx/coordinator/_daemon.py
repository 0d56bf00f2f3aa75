"""``adx coordinator``: load caches from Redis, then serve gRPC with mutual TLS until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass

import grpc

from adx._certs import Identity, component_paths
from adx._grpc_tls import channel_credentials, server_credentials
from adx._health import HealthServicer
from adx._node_client import NodeClients
from adx.config import CoordinatorConfig
from adx.coordinator._cache import CoordinatorCache
from adx.coordinator._service import CoordinatorService
from adx.coordinator._store import CoordinatorStore
from adx.errors import UnavailableError
from adx.proto import coordinator_pb2_grpc, health_pb2_grpc

log = logging.getLogger("adx.coordinator")


@dataclass
class RunningCoordinator:
    server: grpc.aio.Server
    store: CoordinatorStore
    service: CoordinatorService
    health: HealthServicer
    port: int
    scans: asyncio.Task[None]
    stop_scans: asyncio.Event

    async def stop(self, grace: float | None = 5.0) -> None:
        self.health.set_not_serving("stopping")
        self.stop_scans.set()
        self.scans.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.scans
        await self.server.stop(grace)
        if self.service.nodes is not None:
            await self.service.nodes.close()
        await self.store.close()


async def start_coordinator(config: CoordinatorConfig) -> RunningCoordinator:
    paths = component_paths(config.certs_dir, Identity("coordinator", config.name))
    credentials = server_credentials(paths)
    store = CoordinatorStore.from_url(config.redis_url, timeout=config.redis_timeout_seconds)
    try:
        await store.ping()
        cache = await CoordinatorCache.load(store)
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
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        port = server.add_secure_port(config.listen, credentials)
    except RuntimeError as exc:
        await store.close()
        raise UnavailableError(f"coordinator: cannot listen on {config.listen}: {exc}") from None
    await server.start()
    health.set_serving()
    stop_scans = asyncio.Event()
    scans = asyncio.create_task(service.lifecycle.run_scans(config.scan_interval_seconds, stop_scans), name="scans")
    log.info("coordinator serving", extra={"listen": config.listen, "port": port})
    return RunningCoordinator(server, store, service, health, port, scans, stop_scans)


async def run_coordinator(config: CoordinatorConfig) -> None:
    running = await start_coordinator(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("coordinator stopping")
    await running.stop()
