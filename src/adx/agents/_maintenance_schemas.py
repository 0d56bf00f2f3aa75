"""AGT-15: the four frozen audit schemas the maintenance role binds, and the check that refuses a binding
without them.

Seed 003 has ``AgentMaintenanceBinding::new`` bind the tenants, the store and "four frozen audit schemas" but
names only three standard ones (driver, lifecycle, cancellation: the worker's). **Decision** (docs/requirements.md,
AGT-15): the fourth is the maintenance role's own action event, ``agent-maintenance-event/1.0.0`` under the
seed's scheme, like the driver event's ID (AGT-18). The binding holds a frozen registry, so its schemas cannot
change after it is made; readiness (AGT-19) is about live dependencies and does not re-check them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from adx.agents._schemas import (
    AGENT_MAINTENANCE_EVENT_SCHEMA_ID,
    WORKER_AUDIT_SCHEMAS,
    JsonSchemaRegistry,
    JsonSchemaRegistryBuilder,
    SchemaRef,
    register_standard_schemas,
    standard_schema_digest,
)
from adx.errors import InvalidInputError

__all__ = ["MAINTENANCE_AUDIT_SCHEMAS", "bind_audit_schemas", "maintenance_audit_schemas"]

#: The worker's three, then the maintenance role's own action event.
MAINTENANCE_AUDIT_SCHEMAS: tuple[str, ...] = (*WORKER_AUDIT_SCHEMAS, AGENT_MAINTENANCE_EVENT_SCHEMA_ID)


def maintenance_audit_schemas() -> JsonSchemaRegistry:
    """A frozen registry of the four, registered with the runtime's own bodies (no digest written by hand)."""
    builder = JsonSchemaRegistryBuilder.with_default_limits()
    register_standard_schemas(builder, MAINTENANCE_AUDIT_SCHEMAS)
    return builder.build()


def bind_audit_schemas(schemas: object) -> Mapping[str, SchemaRef]:
    """The four schemas' references in ``schemas``; refuses (field ``schemas``) a registry that is not frozen,
    lacks one, or holds one whose body differs from this runtime's (another build's schema under the same ID)."""
    if not isinstance(schemas, JsonSchemaRegistry):
        raise InvalidInputError("schemas", "must be a frozen JsonSchemaRegistry (JsonSchemaRegistryBuilder.build())")
    bound: dict[str, SchemaRef] = {}
    for schema_id in MAINTENANCE_AUDIT_SCHEMAS:
        if schema_id not in schemas:
            raise InvalidInputError(
                "schemas",
                f"maintenance start-up refused: the audit schema {schema_id} is not registered"
                " (register it with its register_standard_* helper)",
            )
        found, expected = schemas.digest(schema_id), standard_schema_digest(schema_id)
        if found != expected:
            raise InvalidInputError(
                "schemas",
                f"maintenance start-up refused: the audit schema {schema_id} is registered with digest {found},"
                f" not this runtime's frozen {expected}",
            )
        bound[schema_id] = SchemaRef(schema_id, found)
    return MappingProxyType(bound)
