"""The maintenance binding's four frozen audit schemas: bound by default, refused when one is missing or differs."""

from __future__ import annotations

import asyncio

import pytest
from agents_helpers import TENANT, build_registry, fetch

from adx.agents import (
    AGENT_CANCELLATION_EVENT_SCHEMA_ID,
    AGENT_MAINTENANCE_EVENT_SCHEMA_ID,
    GRAPH_DRIVER_EVENT_SCHEMA_ID,
    GRAPH_LIFECYCLE_EVENT_SCHEMA_ID,
    AgentMaintenance,
    AgentRuns,
    AgentStore,
    AgentWorkerReadiness,
    JsonSchemaRegistry,
    JsonSchemaRegistryBuilder,
    SchemaLimits,
    register_standard_agent_cancellation_event_schema,
    register_standard_agent_maintenance_event_schema,
    register_standard_graph_driver_event_schema,
    register_standard_graph_lifecycle_event_schema,
)
from adx.agents._maintenance_schemas import MAINTENANCE_AUDIT_SCHEMAS
from adx.agents._schemas import WORKER_AUDIT_SCHEMAS, register_standard_schemas
from adx.errors import InvalidInputError

HELPERS = {
    GRAPH_DRIVER_EVENT_SCHEMA_ID: register_standard_graph_driver_event_schema,
    GRAPH_LIFECYCLE_EVENT_SCHEMA_ID: register_standard_graph_lifecycle_event_schema,
    AGENT_CANCELLATION_EVENT_SCHEMA_ID: register_standard_agent_cancellation_event_schema,
    AGENT_MAINTENANCE_EVENT_SCHEMA_ID: register_standard_agent_maintenance_event_schema,
}


def registry_without(missing: str | None) -> JsonSchemaRegistry:
    builder = JsonSchemaRegistryBuilder.with_default_limits()
    for schema_id, register in HELPERS.items():
        if schema_id != missing:
            register(builder)
    builder.register("urn:adx-test:schema:app:1.0.0", {"type": "object"})  # application schemas may ride along
    return builder.build()


@pytest.mark.req("AGT-15", "AGT-18")
async def test_maintenance_binds_the_four_audit_schemas_under_the_seed_ids(store: AgentStore) -> None:
    """By default the binding holds exactly the four, under the IDs seed 003 publishes (the lifecycle and
    cancellation events verbatim; the driver and maintenance events by the Decisions of AGT-18 and AGT-15)."""
    maintenance = AgentMaintenance(store, [TENANT], AgentWorkerReadiness.database(store))
    assert sorted(maintenance.audit_schemas) == sorted(
        [
            "https://stknot.com/schemas/runtime/graph-driver-event/1.0.0",
            "https://stknot.com/schemas/runtime/graph-lifecycle-event/1.0.0",
            "https://stknot.com/schemas/runtime/agent-cancellation-event/1.0.0",
            "https://stknot.com/schemas/runtime/agent-maintenance-event/1.0.0",
        ]
    )
    # An explicit registry with the same bodies binds the same digests.
    explicit = AgentMaintenance(store, [TENANT], AgentWorkerReadiness.database(store), schemas=registry_without(None))
    assert dict(explicit.audit_schemas) == dict(maintenance.audit_schemas)


@pytest.mark.req("AGT-15")
@pytest.mark.parametrize("missing", list(HELPERS))
async def test_maintenance_refuses_to_start_without_one_of_the_four(store: AgentStore, missing: str) -> None:
    registry = registry_without(missing)
    with pytest.raises(InvalidInputError, match="not registered") as refused:
        AgentMaintenance(store, [TENANT], AgentWorkerReadiness.database(store), schemas=registry)
    assert refused.value.field == "schemas" and missing in str(refused.value)


@pytest.mark.req("AGT-15")
async def test_the_workers_three_schemas_are_not_enough_for_maintenance(store: AgentStore) -> None:
    """A worker's registry (the seed's three standard schemas and the application's) lacks the maintenance event."""
    with pytest.raises(InvalidInputError, match=AGENT_MAINTENANCE_EVENT_SCHEMA_ID):
        AgentMaintenance(store, [TENANT], AgentWorkerReadiness.database(store), schemas=build_registry().schemas)


@pytest.mark.req("AGT-15")
async def test_maintenance_refuses_a_schema_whose_body_differs(store: AgentStore) -> None:
    """Another build's body under a standard ID (a registry not made through the helpers) is refused by digest."""
    good = registry_without(None)
    bodies = {schema_id: dict(good.schema(schema_id)) for schema_id in good.ids()}
    bodies[GRAPH_LIFECYCLE_EVENT_SCHEMA_ID] = {**bodies[GRAPH_LIFECYCLE_EVENT_SCHEMA_ID], "title": "changed"}
    tampered = JsonSchemaRegistry(bodies, good.limits)
    with pytest.raises(InvalidInputError, match="digest") as refused:
        AgentMaintenance(store, [TENANT], AgentWorkerReadiness.database(store), schemas=tampered)
    assert refused.value.field == "schemas" and GRAPH_LIFECYCLE_EVENT_SCHEMA_ID in str(refused.value)
    with pytest.raises(InvalidInputError, match="frozen"):
        AgentMaintenance(
            store,
            [TENANT],
            AgentWorkerReadiness.database(store),
            schemas=JsonSchemaRegistryBuilder.with_default_limits(),  # type: ignore[arg-type]
        )


@pytest.mark.req("AGT-15")
async def test_a_bound_maintenance_works_and_a_refused_one_touched_nothing(store: AgentStore) -> None:
    runs = AgentRuns(store, build_registry())
    late = await runs.submit(TENANT, "chain", "1", {"count": 0}, deadline_seconds=0.001)
    await asyncio.sleep(0.05)
    empty = JsonSchemaRegistry({}, SchemaLimits())
    with pytest.raises(InvalidInputError, match="not registered"):
        AgentMaintenance(store, [TENANT], AgentWorkerReadiness.database(store), schemas=empty)
    assert await fetch(store, "SELECT * FROM adx_agent_maintenance_cursors") == []
    assert not (await runs.get_run(TENANT, late.run_id)).cancel_requested
    bound = AgentMaintenance(store, [TENANT], AgentWorkerReadiness.database(store), schemas=registry_without(None))
    assert await bound.tick() == 0
    assert (await runs.get_run(TENANT, late.run_id)).cancel_requested


def test_registering_a_standard_schema_that_is_not_one_names_the_schema_id() -> None:
    builder = JsonSchemaRegistryBuilder.with_default_limits()
    with pytest.raises(InvalidInputError) as err:
        register_standard_schemas(builder, [*MAINTENANCE_AUDIT_SCHEMAS, "urn:app:schema:mine"])
    assert err.value.field == "schema_id"


def test_the_worker_registry_holds_exactly_the_worker_audit_schemas() -> None:
    builder = JsonSchemaRegistryBuilder.with_default_limits()
    register_standard_schemas(builder, WORKER_AUDIT_SCHEMAS)
    registry = builder.build()
    assert all(schema_id in registry for schema_id in WORKER_AUDIT_SCHEMAS)
    assert AGENT_MAINTENANCE_EVENT_SCHEMA_ID not in registry
    assert MAINTENANCE_AUDIT_SCHEMAS[:3] == WORKER_AUDIT_SCHEMAS
