"""What admitting a run writes, built from the frozen registry: descriptor, request, resolved budget, initial
state. Shared by submission (:meth:`AgentRuns.submit`) and child runs (:meth:`NodeContext.spawn`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adx.agents._canonical import JsonObject, json_clone
from adx.agents._graph import Budget, ExecutableGraphRegistry
from adx.errors import InvalidInputError

__all__ = ["Admission", "build_admission"]


@dataclass(frozen=True, slots=True)
class Admission:
    graph_name: str
    graph_version: str
    entry: str
    descriptor: JsonObject
    request: JsonObject
    budget: JsonObject
    initial_state: Any


def build_admission(
    executables: ExecutableGraphRegistry, graph: str, version: str, input: Any, budget: JsonObject | None
) -> Admission:
    """Validate ``input`` against the graph's input schema and ``budget`` against its limits (errors name the
    field), and build the admitted facts."""
    executable = executables.get(graph, version)
    try:
        request_input = json_clone(input)
    except ValueError as exc:
        raise InvalidInputError("input", str(exc)) from None
    schemas = executables.schemas
    schemas.validate(executable.input_schema, request_input)
    resolved = Budget.resolve(executable.budget, budget)
    descriptor: JsonObject = {
        "agent": executable.name,
        "graph": executable.name,
        "graph_version": executable.version,
        "graph_digest": executable.digest,
        "input_schema": {"id": executable.input_schema, "digest": schemas.digest(executable.input_schema)},
        "output_schema": {"id": executable.output_schema, "digest": schemas.digest(executable.output_schema)},
    }
    if executable.interrupts:
        descriptor["interrupts"] = list(executable.interrupts)
    return Admission(
        graph_name=executable.name,
        graph_version=executable.version,
        entry=executable.entry,
        descriptor=descriptor,
        request={"input": request_input},
        budget=resolved.to_json(),
        initial_state=request_input if isinstance(request_input, dict) else {"input": request_input},
    )
