"""Shared helpers of the agent runtime tests (a unique module name: importable from any test directory)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from adx.agents import (
    AgentStore,
    DurableGraphDriverOptions,
    DurableGraphLifecycleOptions,
    DurableTenantScheduler,
    DurableTenantSchedulerOptions,
    EvidenceRequest,
    ExecutableGraphRegistry,
    ExecutableGraphRegistryBuilder,
    GraphLifecycleEvidenceProvider,
    JsonSchemaRegistryBuilder,
    LifecycleEvidence,
    RunKey,
    register_standard_agent_cancellation_event_schema,
    register_standard_graph_driver_event_schema,
    register_standard_graph_lifecycle_event_schema,
)
from adx.agents._rows import Claim

ANY_OBJECT = "urn:adx-test:schema:any-object:1.0.0"
TENANT = "acme"


def standard_schemas() -> JsonSchemaRegistryBuilder:
    schemas = JsonSchemaRegistryBuilder.with_default_limits()
    register_standard_graph_driver_event_schema(schemas)
    register_standard_graph_lifecycle_event_schema(schemas)
    register_standard_agent_cancellation_event_schema(schemas)
    schemas.register(ANY_OBJECT, {"type": "object"})
    return schemas


def build_registry(*register: Callable[[ExecutableGraphRegistryBuilder], None]) -> ExecutableGraphRegistry:
    import agents_testapp

    schemas = standard_schemas()
    agents_testapp.register_schemas(schemas)
    executables = ExecutableGraphRegistryBuilder(schemas.build())
    agents_testapp.register_graphs(executables)
    for fn in register:
        fn(executables)
    return executables.build()


def make_scheduler(
    store: AgentStore,
    executables: ExecutableGraphRegistry,
    *,
    evidence: GraphLifecycleEvidenceProvider | None = None,
    driver: DurableGraphDriverOptions | None = None,
    lifecycle: DurableGraphLifecycleOptions | None = None,
    options: DurableTenantSchedulerOptions | None = None,
) -> DurableTenantScheduler:
    return DurableTenantScheduler(
        store,
        executables,
        evidence or GraphLifecycleEvidenceProvider(),
        driver or DurableGraphDriverOptions(lease_seconds=5.0, retry_backoff_seconds=0.05),
        lifecycle or DurableGraphLifecycleOptions(evidence_retry_seconds=0.0),
        options or DurableTenantSchedulerOptions(tenant_id=TENANT),
    )


async def claim_next(scheduler: DurableTenantScheduler) -> Claim:
    """Claim the first claimable run the way a tick does (used to drive the loop step by step)."""
    store = scheduler.store
    cutoff = await store.scan_cutoff()
    for candidate in await store.scan_page(scheduler.tenant_id, cutoff, 0, 1000):
        if candidate.claimable:
            claim = await store.claim(
                RunKey(scheduler.tenant_id, candidate.run_id),
                revision=candidate.revision,
                owner=scheduler.identity,
                claim_id=uuid.uuid4(),
                lease_s=scheduler.driver_options.lease_seconds,
            )
            if claim is not None:
                return claim
    raise AssertionError("nothing claimable")


async def fetch(store: AgentStore, query: str, *params: object) -> list[dict[str, Any]]:
    async with store.connection("test query") as conn:
        cur = await conn.execute(query, params)
        return [dict(r) for r in await cur.fetchall()]


class CountingEvidence(GraphLifecycleEvidenceProvider):
    """The real provider, counting how often evidence is read (to prove replays never re-read it)."""

    def __init__(self) -> None:
        self.calls = 0

    async def recover(self, store: AgentStore, request: EvidenceRequest) -> LifecycleEvidence:
        self.calls += 1
        return await super().recover(store, request)
