"""Fixtures for the agent runtime tests: a migrated store on a fresh database per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from adx.agents import (
    AgentRuns,
    AgentStore,
    DurableGraphDriverOptions,
    DurableGraphLifecycleOptions,
    DurableTenantScheduler,
    DurableTenantSchedulerOptions,
    ExecutableGraphRegistry,
    ExecutableGraphRegistryBuilder,
    GraphLifecycleEvidenceProvider,
    JsonSchemaRegistryBuilder,
    register_standard_agent_cancellation_event_schema,
    register_standard_graph_driver_event_schema,
    register_standard_graph_lifecycle_event_schema,
)

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


@pytest.fixture
async def store(postgres_dsn: str) -> AsyncIterator[AgentStore]:
    s = await AgentStore.open(postgres_dsn, max_size=8)
    await s.ensure_tenant(TENANT)
    import agents_testapp

    async with s.connection("test setup") as conn:
        await conn.execute(agents_testapp.EFFECTS_DDL)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def executables() -> ExecutableGraphRegistry:
    return build_registry()


@pytest.fixture
def runs(store: AgentStore, executables: ExecutableGraphRegistry) -> AgentRuns:
    return AgentRuns(store, executables)
