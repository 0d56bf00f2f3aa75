"""JSON Schema registry: register, freeze, validate. Standard audit schemas are registered by helpers.

Schemas are identified by stable absolute URIs; the runtime's own audit schemas use the IDs seed 003
publishes (``https://stknot.com/schemas/runtime/<name>/<semver>``, AGT-18). A schema's digest is always
computed from its canonical JSON (:func:`adx.agents._canonical.digest`) so no digest is ever written by hand.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import SchemaError

from adx.agents._canonical import JsonObject, canonical_json, digest, json_clone
from adx.agents._errors import SchemaValidationError
from adx.errors import ConflictError, InvalidInputError

__all__ = [
    "AGENT_CANCELLATION_EVENT_SCHEMA_ID",
    "AGENT_MAINTENANCE_EVENT_SCHEMA_ID",
    "GRAPH_DRIVER_EVENT_SCHEMA_ID",
    "GRAPH_LIFECYCLE_EVENT_SCHEMA_ID",
    "JsonSchemaRegistry",
    "JsonSchemaRegistryBuilder",
    "SchemaLimits",
    "SchemaRef",
    "register_standard_agent_cancellation_event_schema",
    "register_standard_agent_maintenance_event_schema",
    "register_standard_graph_driver_event_schema",
    "register_standard_graph_lifecycle_event_schema",
    "register_standard_schemas",
    "standard_schema_digest",
]

# AGT-18: the seed's published IDs exactly (the graph-driver event, unpublished there, follows the scheme).
_RESERVED_PREFIX = "https://stknot.com/schemas/runtime/"
# The IDs used before AGT-18 stay reserved, so no application schema can take them.
_RESERVED_PREFIXES = (_RESERVED_PREFIX, "urn:adx:schema:runtime:")
GRAPH_DRIVER_EVENT_SCHEMA_ID = _RESERVED_PREFIX + "graph-driver-event/1.0.0"
GRAPH_LIFECYCLE_EVENT_SCHEMA_ID = _RESERVED_PREFIX + "graph-lifecycle-event/1.0.0"
AGENT_CANCELLATION_EVENT_SCHEMA_ID = _RESERVED_PREFIX + "agent-cancellation-event/1.0.0"
# AGT-15 Decision: the seed has maintenance bind "four frozen audit schemas" but names only the three above;
# the fourth is the maintenance role's own action event, under the same scheme.
AGENT_MAINTENANCE_EVENT_SCHEMA_ID = _RESERVED_PREFIX + "agent-maintenance-event/1.0.0"

_URI = re.compile(r"^(urn:[a-z0-9][a-z0-9-]{0,31}:[\x21-\x7e]+|https://[\x21-\x7e]+)$")
_DIGEST = {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}
_UUID = {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"}
_COUNT = {"type": "integer", "minimum": 0}
_USAGE = {
    "type": "object",
    "required": ["input_tokens", "output_tokens", "model_calls", "tool_calls", "node_commits"],
    "properties": {
        "input_tokens": _COUNT,
        "output_tokens": _COUNT,
        "model_calls": _COUNT,
        "tool_calls": _COUNT,
        "node_commits": _COUNT,
    },
    "additionalProperties": False,
}


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """Bounds on what a registry holds and on the documents it validates."""

    max_schemas: int = 256
    max_schema_bytes: int = 64 * 1024
    max_document_bytes: int = 1024 * 1024
    max_depth: int = 64


@dataclass(frozen=True, slots=True)
class SchemaRef:
    schema_id: str
    digest: str


def _depth(value: Any, limit: int) -> int:
    # Iterative, so a hostile document cannot exhaust the Python stack before we reject it.
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
    return deepest


def _json_path(path: Any) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class JsonSchemaRegistry:
    """A frozen set of schemas; validation is offline (no remote ``$ref`` resolution ever happens)."""

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]], limits: SchemaLimits) -> None:
        self._limits = limits
        self._schemas: Mapping[str, Mapping[str, Any]] = MappingProxyType(dict(schemas))
        self._digests = MappingProxyType({sid: digest(s) for sid, s in schemas.items()})
        self._validators = {
            sid: Draft202012Validator(dict(s), format_checker=FormatChecker()) for sid, s in schemas.items()
        }

    @property
    def limits(self) -> SchemaLimits:
        return self._limits

    def __contains__(self, schema_id: object) -> bool:
        return schema_id in self._schemas

    def ids(self) -> list[str]:
        return sorted(self._schemas)

    def ref(self, schema_id: str) -> SchemaRef:
        return SchemaRef(schema_id, self.digest(schema_id))

    def digest(self, schema_id: str) -> str:
        try:
            return self._digests[schema_id]
        except KeyError:
            raise InvalidInputError("schema_id", f"schema {schema_id!r} is not registered") from None

    def schema(self, schema_id: str) -> Mapping[str, Any]:
        self.digest(schema_id)
        return self._schemas[schema_id]

    def validate(self, schema_id: str, document: Any) -> None:
        """Raise :class:`SchemaValidationError` (naming the JSON path) unless ``document`` matches."""
        validator = self._validators.get(schema_id)
        if validator is None:
            raise InvalidInputError("schema_id", f"schema {schema_id!r} is not registered")
        try:
            size = len(canonical_json(document))
        except ValueError as exc:
            raise SchemaValidationError(schema_id, "$", str(exc)) from None
        if size > self._limits.max_document_bytes:
            raise SchemaValidationError(
                schema_id, "$", f"document is {size} bytes (limit {self._limits.max_document_bytes})"
            )
        if _depth(document, self._limits.max_depth) > self._limits.max_depth:
            raise SchemaValidationError(schema_id, "$", f"document nests deeper than {self._limits.max_depth}")
        error = next(iter(validator.iter_errors(document)), None)
        if error is not None:
            raise SchemaValidationError(schema_id, _json_path(error.absolute_path), error.message)


class JsonSchemaRegistryBuilder:
    """Collects schemas, then :meth:`build` freezes them. Registration is idempotent for identical schemas."""

    def __init__(self, limits: SchemaLimits) -> None:
        self._limits = limits
        self._schemas: dict[str, JsonObject] = {}
        self._built = False

    @classmethod
    def with_default_limits(cls) -> JsonSchemaRegistryBuilder:
        return cls(SchemaLimits())

    def register(self, schema_id: str, schema: Mapping[str, Any]) -> SchemaRef:
        """Register an application schema under ``schema_id`` (an absolute ``urn:`` or ``https://`` URI)."""
        if isinstance(schema_id, str) and schema_id.startswith(_RESERVED_PREFIXES):
            raise InvalidInputError("schema_id", f"{schema_id!r} is reserved for the runtime's standard helpers")
        return self._register(schema_id, schema)

    def _register(self, schema_id: str, schema: Mapping[str, Any]) -> SchemaRef:
        if self._built:
            raise ConflictError("schema registry is already built (frozen)")
        if not isinstance(schema_id, str) or not _URI.match(schema_id):
            raise InvalidInputError("schema_id", f"{schema_id!r} is not an absolute urn: or https:// URI")
        if not isinstance(schema, Mapping):
            raise InvalidInputError("schema", "must be a JSON object")
        try:
            body = json_clone(dict(schema))
        except ValueError as exc:
            raise InvalidInputError("schema", str(exc)) from None
        declared = body.setdefault("$id", schema_id)
        if declared != schema_id:
            raise InvalidInputError("schema.$id", f"{declared!r} differs from the registered id {schema_id!r}")
        size = len(canonical_json(body))
        if size > self._limits.max_schema_bytes:
            raise InvalidInputError("schema", f"{size} bytes exceeds the limit of {self._limits.max_schema_bytes}")
        try:
            Draft202012Validator.check_schema(body)
        except SchemaError as exc:
            raise InvalidInputError("schema" + _json_path(exc.path)[1:], exc.message) from None
        existing = self._schemas.get(schema_id)
        if existing is not None:
            if digest(existing) != digest(body):
                raise ConflictError(f"schema {schema_id!r} is already registered with a different body")
            return SchemaRef(schema_id, digest(body))
        if len(self._schemas) >= self._limits.max_schemas:
            raise InvalidInputError("schema_id", f"registry holds the maximum of {self._limits.max_schemas} schemas")
        self._schemas[schema_id] = body
        return SchemaRef(schema_id, digest(body))

    def build(self) -> JsonSchemaRegistry:
        self._built = True
        return JsonSchemaRegistry(self._schemas, self._limits)


def _standard(schema_id: str, title: str, properties: JsonObject, required: list[str]) -> JsonObject:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id,
        "title": title,
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": False,
    }


_DRIVER_EVENT = _standard(
    GRAPH_DRIVER_EVENT_SCHEMA_ID,
    "ADX graph driver event: one committed node step of a durable run",
    {
        "kind": {"enum": ["node_committed"]},
        "run_id": _UUID,
        "fence": {"type": "integer", "minimum": 1},
        "step": {"type": "integer", "minimum": 1},
        "node": {"type": "string", "minLength": 1, "maxLength": 128},
        "next_node": {"type": ["string", "null"], "maxLength": 128},
        "attempt_id": _UUID,
        "state_digest": _DIGEST,
        "usage": _USAGE,
    },
    ["kind", "run_id", "fence", "step", "node", "next_node", "attempt_id", "state_digest", "usage"],
)

_WAIT = {
    "type": "object",
    "required": ["wait_id", "kind"],
    "properties": {
        "wait_id": {"type": "string", "minLength": 1, "maxLength": 128},
        "kind": {"enum": ["interrupt", "timer", "join"]},
        "timer_ms": {"type": "integer", "minimum": 0},
    },
    "additionalProperties": False,
}

_LIFECYCLE_EVENT = _standard(
    GRAPH_LIFECYCLE_EVENT_SCHEMA_ID,
    "ADX graph lifecycle event: one lifecycle edge (wait, success, failure, release) of a durable run",
    {
        "kind": {"enum": ["waiting", "succeeded", "failed", "released"]},
        "event_id": _UUID,
        "run_id": _UUID,
        "fence": {"type": "integer", "minimum": 1},
        "checkpoint_seq": {"type": "integer", "minimum": 0},
        "attempt_id": _UUID,
        "outcome": {"enum": ["deferred", "yielded", "recovery_released"]},
        "waits": {"type": "array", "items": _WAIT, "maxItems": 64},
        "result_digest": _DIGEST,
        "reason": {"type": "string", "maxLength": 1024},
        "usage": _USAGE,
    },
    ["kind", "event_id", "run_id", "fence", "checkpoint_seq"],
)

# Public-safe: carries identities, times and counters only, never request or artifact content.
_CANCELLATION_EVENT = _standard(
    AGENT_CANCELLATION_EVENT_SCHEMA_ID,
    "ADX agent cancellation event: a confirmed cancellation (public-safe: no request content)",
    {
        "kind": {"enum": ["cancellation_confirmed"]},
        "event_id": _UUID,
        "run_id": _UUID,
        "fence": {"type": "integer", "minimum": 1},
        "checkpoint_seq": {"type": "integer", "minimum": 0},
        "usage": _USAGE,
    },
    ["kind", "event_id", "run_id", "fence", "checkpoint_seq", "usage"],
)


def register_standard_graph_driver_event_schema(builder: JsonSchemaRegistryBuilder) -> SchemaRef:
    return builder._register(GRAPH_DRIVER_EVENT_SCHEMA_ID, _DRIVER_EVENT)


def register_standard_graph_lifecycle_event_schema(builder: JsonSchemaRegistryBuilder) -> SchemaRef:
    return builder._register(GRAPH_LIFECYCLE_EVENT_SCHEMA_ID, _LIFECYCLE_EVENT)


def register_standard_agent_cancellation_event_schema(builder: JsonSchemaRegistryBuilder) -> SchemaRef:
    return builder._register(AGENT_CANCELLATION_EVENT_SCHEMA_ID, _CANCELLATION_EVENT)


# Public-safe like the cancellation event: what maintenance did to which run, never request content.
_MAINTENANCE_EVENT = _standard(
    AGENT_MAINTENANCE_EVENT_SCHEMA_ID,
    "ADX agent maintenance event: one maintenance action on a run (public-safe: no request content)",
    {
        "kind": {
            "enum": [
                "deadline_cancellation_requested",
                "child_cancellation_requested",
                "join_published",
                "children_settled",
            ]
        },
        "event_id": _UUID,
        "run_id": _UUID,
        "parent_run_id": _UUID,
        "wait_id": {"type": "string", "minLength": 1, "maxLength": 128},
        "children": {"type": "integer", "minimum": 0},
    },
    ["kind", "event_id", "run_id"],
)


def register_standard_agent_maintenance_event_schema(builder: JsonSchemaRegistryBuilder) -> SchemaRef:
    return builder._register(AGENT_MAINTENANCE_EVENT_SCHEMA_ID, _MAINTENANCE_EVENT)


_STANDARD: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        GRAPH_DRIVER_EVENT_SCHEMA_ID: _DRIVER_EVENT,
        GRAPH_LIFECYCLE_EVENT_SCHEMA_ID: _LIFECYCLE_EVENT,
        AGENT_CANCELLATION_EVENT_SCHEMA_ID: _CANCELLATION_EVENT,
        AGENT_MAINTENANCE_EVENT_SCHEMA_ID: _MAINTENANCE_EVENT,
    }
)


#: The standard audit schemas a worker's driver and lifecycle commit events under: a worker's registry holds them
#: all (AGT-13), and the lifecycle refuses to start without them.
WORKER_AUDIT_SCHEMAS: tuple[str, ...] = (
    GRAPH_DRIVER_EVENT_SCHEMA_ID,
    GRAPH_LIFECYCLE_EVENT_SCHEMA_ID,
    AGENT_CANCELLATION_EVENT_SCHEMA_ID,
)


def _standard_body(schema_id: str) -> Mapping[str, Any]:
    try:
        return _STANDARD[schema_id]
    except KeyError:
        raise InvalidInputError("schema_id", f"{schema_id!r} is not a standard audit schema") from None


def standard_schema_digest(schema_id: str) -> str:
    """The digest of this build's frozen body of a standard audit schema (what a bound registry must hold)."""
    return digest(_standard_body(schema_id))


def register_standard_schemas(builder: JsonSchemaRegistryBuilder, schema_ids: Iterable[str]) -> None:
    """Register each named standard audit schema with this build's frozen body, in the order given."""
    for schema_id in schema_ids:
        builder._register(schema_id, _standard_body(schema_id))
