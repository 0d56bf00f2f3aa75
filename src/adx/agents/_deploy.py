"""Assembling an immutable worker deployment from an application's registrations, and running it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from types import ModuleType

from adx._httpserver import HttpLimits, HttpRequest, HttpResponse, serve_http
from adx.agents._catalog import publish_graphs
from adx.agents._config import AgentWorkerConfig
from adx.agents._driver import DurableGraphDriverOptions
from adx.agents._environments import EnvironmentAccess
from adx.agents._fair import DurableFairScheduler, FairnessPolicy
from adx.agents._graph import ExecutableGraphRegistry, ExecutableGraphRegistryBuilder
from adx.agents._lifecycle import DurableGraphLifecycleOptions, GraphLifecycleEvidenceProvider
from adx.agents._loading import load_application
from adx.agents._options import options_from
from adx.agents._scheduler import DurableTenantScheduler, DurableTenantSchedulerOptions
from adx.agents._schemas import WORKER_AUDIT_SCHEMAS, JsonSchemaRegistryBuilder, register_standard_schemas
from adx.agents._signals import stop_on_signals
from adx.agents._store import AgentStore
from adx.agents._worker import (
    AgentWorker,
    AgentWorkerBinding,
    AgentWorkerHealth,
    AgentWorkerOptions,
    AgentWorkerReadiness,
)

__all__ = ["build_executables", "load_registrations", "run_worker"]

log = logging.getLogger("adx.agents.worker")


def load_registrations(path: str) -> ModuleType:
    """``MODULE`` (its register_graphs, or its adx.agents.App graphs), ``MODULE:APP`` or a ``.py`` file."""
    return load_application(path, field="registrations")


def build_executables(module: ModuleType) -> ExecutableGraphRegistry:
    """Standard audit schemas, then the application's schemas, frozen; then its graphs, frozen (AGT-1)."""
    schemas = JsonSchemaRegistryBuilder.with_default_limits()
    register_standard_schemas(schemas, WORKER_AUDIT_SCHEMAS)
    register_schemas = getattr(module, "register_schemas", None)
    if register_schemas is not None:
        register_schemas(schemas)
    executables = ExecutableGraphRegistryBuilder(schemas.build())
    module.register_graphs(executables)
    return executables.build()


#: A health probe sends a bare GET: anything larger or slower is not one.
HEALTH_LIMITS = HttpLimits(head_bytes=8 << 10, header_count=50, body_bytes=1 << 10, head_seconds=5.0, body_seconds=5.0)


async def serve_health(health: Callable[[], AgentWorkerHealth], host: str, port: int) -> asyncio.Server:
    """A minimal HTTP endpoint: ``GET /healthz`` -> the worker's health as JSON (503 unless ready).

    Only local state and counters are served; never request content (AGT-14). One request per connection."""

    async def answer(request: HttpRequest) -> HttpResponse:
        if request.method != "GET" or request.target != "/healthz":
            return HttpResponse(404, b'{"error": "not found"}')
        now = health()
        status = 200 if now.ready and now.state == "running" else 503
        return HttpResponse(status, json.dumps(dataclasses.asdict(now)).encode())

    def refusal(status: int, message: str) -> bytes:
        return json.dumps({"error": message}).encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_http(reader, writer, answer, refusal, HEALTH_LIMITS, keep_alive=False)

    return await asyncio.start_server(handle, host, port)


async def run_worker(cfg: AgentWorkerConfig, module: ModuleType | None = None) -> AgentWorkerHealth:
    """Run a tenant worker until SIGTERM/SIGINT; then drain and stop. Returns the final health.

    ``module``: registrations already loaded (else ``cfg.registrations`` is imported)."""
    module = module if module is not None else load_registrations(cfg.registrations)
    executables = build_executables(module)
    store = await AgentStore.open(cfg.database_url, max_size=cfg.pool_max_size or cfg.slots + 2, migrate=cfg.migrate)
    extra_stores: list[AgentStore] = []
    environments = (
        EnvironmentAccess(
            cfg.environments.api_url,
            cfg.environments.api_key.get_secret_value(),
            cfg.environments.timeout_seconds,
            cfg.environments.ready_timeout_seconds,
        )
        if cfg.environments is not None
        else None
    )
    try:
        await publish_graphs(store, executables)  # submitters admit runs from it without this registry
        make_evidence = getattr(module, "evidence_provider", None)

        def tenant_scheduler(tenant_id: str, tenant_store: AgentStore) -> DurableTenantScheduler:
            evidence = make_evidence() if make_evidence is not None else GraphLifecycleEvidenceProvider()
            return DurableTenantScheduler(
                tenant_store,
                executables,
                evidence,
                options_from(DurableGraphDriverOptions, cfg, environments=environments),
                DurableGraphLifecycleOptions(),
                DurableTenantSchedulerOptions(tenant_id=tenant_id),
            )

        binding: AgentWorkerBinding
        if cfg.fairness is None:
            await store.ensure_tenant(cfg.tenant_id)
            scheduler = tenant_scheduler(cfg.tenant_id, store)
            binding = AgentWorkerBinding.tenant(scheduler)
        else:
            schedulers = []
            for tenant_id in sorted(cfg.fairness.weights):
                url = cfg.fairness.tenant_database_urls.get(tenant_id)
                tenant_store = store
                if url is not None:
                    tenant_store = await AgentStore.open(url, max_size=cfg.slots + 2, migrate=False)
                    extra_stores.append(tenant_store)
                await tenant_store.ensure_tenant(tenant_id)
                schedulers.append(tenant_scheduler(tenant_id, tenant_store))
            policy = FairnessPolicy(cfg.fairness.policy, dict(cfg.fairness.weights))
            binding = AgentWorkerBinding.fair(
                DurableFairScheduler(store, schedulers, policy, idle_backoff_seconds=cfg.idle_poll_seconds)
            )
        make_readiness = getattr(module, "readiness", None)
        readiness = make_readiness(store) if make_readiness is not None else AgentWorkerReadiness.database(store)
        worker = await AgentWorker.start(
            binding,
            readiness,
            options_from(AgentWorkerOptions, cfg, liveness_grace_seconds=cfg.liveness_grace_seconds or None),
        )
        server = (
            await serve_health(worker.health, cfg.health_host, cfg.health_port) if cfg.health_port is not None else None
        )
        if server is not None:
            bound = server.sockets[0].getsockname()
            log.info("health endpoint listening", extra={"address": f"{bound[0]}:{bound[1]}"})
        stopping: list[asyncio.Task[None]] = []

        def stop() -> None:
            if not stopping:
                stopping.append(asyncio.ensure_future(worker.shutdown()))

        try:
            with stop_on_signals(stop):
                await worker.wait()
                if stopping:
                    await stopping[0]
        finally:
            if server is not None:
                server.close()
                await server.wait_closed()
        health = worker.health()
        log.info("agent worker stopped", extra={"ticks": health.ticks, "executed": health.executed})
        return health
    finally:
        for extra in extra_stores:
            await extra.close()
        await store.close()
