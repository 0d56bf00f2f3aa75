"""The graph model authors write against, and the frozen registry of executable graphs.

A graph is a set of named nodes (async steps), a reducer per node that merges the node's update into the
run state, edges or routing functions choosing the next node, and a terminal function that turns the final
state into the run's artifact. Everything a graph needs (schemas, model providers, tools) is registered in an
:class:`ExecutableGraphRegistryBuilder` and frozen by :meth:`~ExecutableGraphRegistryBuilder.build` before a
scheduler may claim any run.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from adx.agents._canonical import JsonObject, digest, json_clone
from adx.agents._schemas import JsonSchemaRegistry
from adx.agents._tools import ReconcileFn, ToolDef, ToolFn, takes_call
from adx.errors import ConflictError, InvalidInputError

if TYPE_CHECKING:
    from adx.agents._context import NodeContext

__all__ = [
    "END",
    "Budget",
    "ChildRun",
    "ExecutableGraph",
    "ExecutableGraphRegistry",
    "ExecutableGraphRegistryBuilder",
    "Fail",
    "GraphBuilder",
    "Interrupt",
    "Join",
    "JoinPolicy",
    "ModelChunk",
    "ModelProvider",
    "Next",
    "NodeOutcome",
    "NodeWaits",
    "Timer",
    "Usage",
]

END = "__end__"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")

JSON: TypeAlias = Any


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage a model provider reported for one call."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class ModelChunk:
    """One streamed piece of a model response; the provider reports ``usage`` on (at most) one chunk."""

    text: str = ""
    usage: Usage | None = None


class ModelProvider(Protocol):
    """A model behind a streaming interface. ``request`` is JSON; chunks arrive in order."""

    def stream(self, request: JSON) -> AsyncIterator[ModelChunk]: ...


@dataclass(frozen=True, slots=True)
class Next:
    """Continue: merge ``update`` into the state with the node's reducer, then follow the edge (or ``goto``)."""

    update: JSON = None
    goto: str | None = None


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Wait for an external resolution (:meth:`adx.agents.AgentRuns.resolve_interrupt`)."""

    wait_id: str
    payload: JSON = None


@dataclass(frozen=True, slots=True)
class Timer:
    """Wait ``seconds``; the due time is computed from *database* time when the wait is registered."""

    wait_id: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ChildRun:
    """A child run a node spawned (:meth:`NodeContext.spawn`): same tenant, its own graph, input and budget."""

    run_id: uuid.UUID
    graph: str
    version: str


class JoinPolicy(StrEnum):
    ALL = "all"  # wait until every child finished; failed or cancelled children are reported, nothing else
    FAIL_FAST = "fail_fast"  # a failed or cancelled child gets its live siblings cancelled (then published)


@dataclass(frozen=True, slots=True)
class Join:
    """Wait until every child in ``children`` finished. The maintenance role publishes the join (the wait is
    resolved with each child's outcome, read as ``wake.children``) once all are terminal; ``policy`` says how a
    child failure converges. At most one Join per :class:`NodeWaits`."""

    wait_id: str
    children: tuple[ChildRun | uuid.UUID, ...]
    policy: JoinPolicy = JoinPolicy.ALL


@dataclass(frozen=True, slots=True)
class NodeWaits:
    """Suspend the run until any of ``waits`` fires; then run ``resume_at`` (default: the same node again).

    Waits carry no registration timestamps: the wait edge registers them with database time (AGT-5).
    """

    waits: tuple[Interrupt | Timer | Join, ...]
    update: JSON = None
    resume_at: str | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """End the run as failed with a public ``reason``."""

    reason: str


NodeOutcome: TypeAlias = Next | NodeWaits | Fail
NodeFn: TypeAlias = Callable[["NodeContext", JSON], Awaitable[NodeOutcome | None]]
Reducer: TypeAlias = Callable[[JSON, JSON], JSON]
RouteFn: TypeAlias = Callable[[JSON], str]
TerminalFn: TypeAlias = Callable[[JSON], JSON]


@dataclass(frozen=True, slots=True)
class Budget:
    """Resolved per-run limits; ``None`` means unlimited for that dimension."""

    max_steps: int = 1000
    max_model_calls: int | None = None
    max_tokens: int | None = None

    def to_json(self) -> JsonObject:
        return {"max_steps": self.max_steps, "max_model_calls": self.max_model_calls, "max_tokens": self.max_tokens}

    @classmethod
    def resolve(cls, default: Budget, requested: Mapping[str, Any] | None) -> Budget:
        """Overlay a requested budget on the graph default; a request may only lower limits."""
        if requested is None:
            return default
        if not isinstance(requested, Mapping):
            raise InvalidInputError("budget", "must be an object")
        unknown = set(requested) - {"max_steps", "max_model_calls", "max_tokens"}
        if unknown:
            raise InvalidInputError(f"budget.{sorted(unknown)[0]}", "unknown budget key")
        values: dict[str, int | None] = {}
        for key in ("max_steps", "max_model_calls", "max_tokens"):
            ceiling = getattr(default, key)
            value = requested.get(key, ceiling)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise InvalidInputError(f"budget.{key}", "must be a positive integer")
            if ceiling is not None and (value is None or value > ceiling):
                raise InvalidInputError(f"budget.{key}", f"must not exceed the graph's limit of {ceiling}")
            values[key] = value
        max_steps = values["max_steps"]
        assert max_steps is not None
        return cls(max_steps=max_steps, max_model_calls=values["max_model_calls"], max_tokens=values["max_tokens"])


def merge_reducer(state: JSON, update: JSON) -> JSON:
    """Default reducer: shallow-merge a dict update into a dict state; ``None`` leaves the state as is."""
    if update is None:
        return state
    if not isinstance(state, dict) or not isinstance(update, dict):
        raise InvalidInputError("update", "the merge reducer needs a dict state and a dict update")
    return {**state, **update}


@dataclass(frozen=True, slots=True)
class NodeDef:
    name: str
    fn: NodeFn
    reducer: str


@dataclass(frozen=True)
class ExecutableGraph:
    name: str
    version: str
    entry: str
    nodes: Mapping[str, NodeDef]
    edges: Mapping[str, str]
    routes: Mapping[str, tuple[RouteFn, tuple[str, ...]]]
    terminal: TerminalFn
    input_schema: str
    output_schema: str
    budget: Budget
    reducers: Mapping[str, Reducer]
    interrupts: tuple[str, ...] = ()
    digest: str = field(default="")

    def reduce(self, node: str, state: JSON, update: JSON) -> JSON:
        return json_clone(self.reducers[self.nodes[node].reducer](state, update))

    def next_node(self, node: str, state: JSON, goto: str | None) -> str:
        """The node after ``node`` (or :data:`END`); ``goto`` must be one of the declared targets."""
        if node in self.routes:
            fn, targets = self.routes[node]
            chosen = goto if goto is not None else fn(state)
            if chosen not in targets:
                raise InvalidInputError("goto", f"node {node!r} may route only to {list(targets)}, not {chosen!r}")
            return chosen
        target = self.edges[node]
        if goto is not None and goto != target:
            raise InvalidInputError("goto", f"node {node!r} has a fixed edge to {target!r}")
        return target


@dataclass(frozen=True, slots=True)
class _GraphContract:
    """What :meth:`ExecutableGraphRegistryBuilder.graph` declares besides the nodes (checked when it is built)."""

    entry: str
    input_schema: str  # schema IDs in the registry's frozen schemas
    output_schema: str
    budget: Budget
    interrupts: tuple[str, ...]  # sorted, distinct


class GraphBuilder:
    """Declares one graph; obtained from :meth:`ExecutableGraphRegistryBuilder.graph`."""

    def __init__(
        self, owner: ExecutableGraphRegistryBuilder, name: str, version: str, contract: _GraphContract
    ) -> None:
        self._owner = owner
        self.name = name
        self.version = version
        self._contract = contract
        self._nodes: dict[str, NodeDef] = {}
        self._edges: dict[str, str] = {}
        self._routes: dict[str, tuple[RouteFn, tuple[str, ...]]] = {}
        self._terminal: TerminalFn | None = None

    def node(self, name: str, fn: NodeFn, *, reducer: str = "merge") -> GraphBuilder:
        self._owner._check_open()
        if not _NAME.match(name) or name == END:
            raise InvalidInputError("node", f"{name!r} is not a valid node name")
        if name in self._nodes:
            raise ConflictError(f"graph {self.name!r} already has a node {name!r}")
        if not callable(fn):
            raise InvalidInputError(f"nodes.{name}", "must be an async callable")
        self._nodes[name] = NodeDef(name, fn, reducer)
        return self

    def _check_leaves_once(self, source: str) -> None:
        # A node leaves by exactly one edge or one route.
        self._owner._check_open()
        if source in self._edges or source in self._routes:
            raise ConflictError(f"node {source!r} already has an outgoing edge or route")

    def edge(self, source: str, target: str) -> GraphBuilder:
        self._check_leaves_once(source)
        self._edges[source] = target
        return self

    def route(self, source: str, fn: RouteFn, targets: list[str] | tuple[str, ...]) -> GraphBuilder:
        self._check_leaves_once(source)
        if not targets:
            raise InvalidInputError(f"routes.{source}", "needs at least one target")
        self._routes[source] = (fn, tuple(targets))
        return self

    def terminal(self, fn: TerminalFn) -> GraphBuilder:
        self._owner._check_open()
        self._terminal = fn
        return self

    def _build(self, schemas: JsonSchemaRegistry, reducers: Mapping[str, Reducer]) -> ExecutableGraph:
        where = f"graphs.{self.name}"
        c = self._contract
        if c.entry not in self._nodes:
            raise InvalidInputError(f"{where}.entry", f"{c.entry!r} is not a node of the graph")
        if self._terminal is None:
            raise InvalidInputError(f"{where}.terminal", "a graph needs a terminal function")
        for key, schema_id in (("input_schema", c.input_schema), ("output_schema", c.output_schema)):
            if schema_id not in schemas:
                raise InvalidInputError(f"{where}.{key}", f"schema {schema_id!r} is not registered")
        for name, node in self._nodes.items():
            if node.reducer not in reducers:
                raise InvalidInputError(f"{where}.nodes.{name}.reducer", f"reducer {node.reducer!r} is not registered")
            if name not in self._edges and name not in self._routes:
                raise InvalidInputError(f"{where}.nodes.{name}", "has no outgoing edge or route")
        targets = [(s, t) for s, t in self._edges.items()] + [(s, t) for s, (_, ts) in self._routes.items() for t in ts]
        for source, target in targets:
            if source not in self._nodes:
                raise InvalidInputError(f"{where}.edges.{source}", "source is not a node of the graph")
            if target != END and target not in self._nodes:
                raise InvalidInputError(f"{where}.edges.{source}", f"target {target!r} is not a node of the graph")
        # The digest names the graph's structure and contracts: a run admitted under one digest is never
        # driven by a registry whose graph of the same name and version differs.
        structure = {
            "name": self.name,
            "version": self.version,
            "entry": c.entry,
            "nodes": {n: d.reducer for n, d in sorted(self._nodes.items())},
            "edges": dict(sorted(self._edges.items())),
            "routes": {s: list(ts) for s, (_, ts) in sorted(self._routes.items())},
            "input_schema": schemas.digest(c.input_schema),
            "output_schema": schemas.digest(c.output_schema),
            "budget": c.budget.to_json(),
        }
        if c.interrupts:  # absent when none: digests of graphs declaring none are unchanged
            structure["interrupts"] = list(c.interrupts)
        return ExecutableGraph(
            name=self.name,
            version=self.version,
            entry=c.entry,
            nodes=MappingProxyType(dict(self._nodes)),
            edges=MappingProxyType(dict(self._edges)),
            routes=MappingProxyType(dict(self._routes)),
            terminal=self._terminal,
            input_schema=c.input_schema,
            output_schema=c.output_schema,
            budget=c.budget,
            reducers=reducers,
            interrupts=c.interrupts,
            digest=digest(structure),
        )


class ExecutableGraphRegistry:
    """Frozen graphs, reducers, model providers and tools, sharing one frozen schema registry."""

    frozen = True

    def __init__(
        self,
        schemas: JsonSchemaRegistry,
        graphs: Mapping[tuple[str, str], ExecutableGraph],
        models: Mapping[str, ModelProvider],
        tools: Mapping[str, ToolDef],
    ) -> None:
        self.schemas = schemas
        self._graphs = MappingProxyType(dict(graphs))
        self.models: Mapping[str, ModelProvider] = MappingProxyType(dict(models))
        self.tools: Mapping[str, ToolDef] = MappingProxyType(dict(tools))

    def get(self, name: str, version: str) -> ExecutableGraph:
        try:
            return self._graphs[(name, version)]
        except KeyError:
            raise InvalidInputError("graph", f"graph {name!r} version {version!r} is not registered") from None

    def graphs(self) -> list[ExecutableGraph]:
        return [self._graphs[k] for k in sorted(self._graphs)]


class ExecutableGraphRegistryBuilder:
    """Registers reducers, model providers, tools and graphs; :meth:`build` validates and freezes them."""

    def __init__(self, schemas: JsonSchemaRegistry) -> None:
        if not isinstance(schemas, JsonSchemaRegistry):
            raise InvalidInputError("schemas", "must be a built (frozen) JsonSchemaRegistry")
        self._schemas = schemas
        self._reducers: dict[str, Reducer] = {"merge": merge_reducer}
        self._models: dict[str, ModelProvider] = {}
        self._tools: dict[str, ToolDef] = {}
        self._graphs: dict[tuple[str, str], GraphBuilder] = {}
        self._built = False

    def _check_open(self) -> None:
        if self._built:
            raise ConflictError("executable registry is already built (frozen)")

    def _check_name(self, kind: str, name: str, taken: Mapping[str, object]) -> None:
        self._check_open()
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidInputError(kind, f"{name!r} is not a valid name")
        if name in taken:
            raise ConflictError(f"{kind} {name!r} is already registered")

    def register_reducer(self, name: str, fn: Reducer) -> None:
        self._check_name("reducer", name, self._reducers)
        self._reducers[name] = fn

    def register_model_provider(self, name: str, provider: ModelProvider) -> None:
        self._check_name("model_provider", name, self._models)
        self._models[name] = provider

    def register_tool(
        self, name: str, fn: ToolFn, *, idempotent: bool = True, reconcile: ReconcileFn | None = None
    ) -> None:
        """Register ``async def fn(arguments)`` or ``async def fn(arguments, call: ToolCall)``.

        ``idempotent=False``: a call whose outcome is unknown after a crash is not dispatched again unless
        ``reconcile(arguments, call)`` answers :meth:`Reconciled.not_done`; without a hook the run fails.
        """
        self._check_name("tool", name, self._tools)
        if not callable(fn):
            raise InvalidInputError(f"tools.{name}", "must be an async callable")
        if reconcile is not None and not callable(reconcile):
            raise InvalidInputError(f"tools.{name}.reconcile", "must be an async callable")
        if reconcile is not None and idempotent:
            raise InvalidInputError(f"tools.{name}.reconcile", "only a non-idempotent tool is reconciled")
        self._tools[name] = ToolDef(name, fn, idempotent, reconcile, takes_call(fn))

    def graph(
        self,
        name: str,
        version: str,
        *,
        entry: str,
        input_schema: str,
        output_schema: str,
        budget: Budget | None = None,
        interrupts: tuple[str, ...] | list[str] = (),
    ) -> GraphBuilder:
        """``interrupts``: the interrupt names the graph may wait on. Declared names can be resolved before
        the run reaches its wait (the resolution is stored and consumed then); an undeclared name is refused
        as a typo. A graph that declares none accepts resolutions only while it waits."""
        self._check_open()
        for wait_id in interrupts:
            if not isinstance(wait_id, str) or not 0 < len(wait_id) <= 128:
                raise InvalidInputError("interrupts", f"{wait_id!r} is not an interrupt name (1-128 characters)")
        if not _NAME.match(name):
            raise InvalidInputError("graph", f"{name!r} is not a valid graph name")
        if not isinstance(version, str) or not _VERSION.match(version):
            raise InvalidInputError(
                "version", f"{version!r} is not a valid version (letters, digits, '.', '_', '+', '-')"
            )
        if (name, version) in self._graphs:
            raise ConflictError(f"graph {name!r} version {version!r} is already registered")
        builder = GraphBuilder(
            self,
            name,
            version,
            _GraphContract(entry, input_schema, output_schema, budget or Budget(), tuple(sorted(set(interrupts)))),
        )
        self._graphs[(name, version)] = builder
        return builder

    def build(self) -> ExecutableGraphRegistry:
        self._check_open()
        reducers = MappingProxyType(dict(self._reducers))
        graphs = {key: g._build(self._schemas, reducers) for key, g in self._graphs.items()}
        self._built = True
        return ExecutableGraphRegistry(self._schemas, graphs, self._models, self._tools)
