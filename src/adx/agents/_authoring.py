"""The authoring layer: a graph from decorated async functions (or a LangGraph-like builder) over the seed's
registries.

An :class:`App` is one graph (name and version) plus its tools. It registers the same things a hand-written
``register_schemas``/``register_graphs`` module would: the state (and output) schema derived from a pydantic
model or a plain JSON object, the nodes wrapped so they take and return models, the edges, the terminal
function and the tools. Nothing new runs underneath: the seed's driver, checkpoints and guarantees apply as
they are, and the seed's names keep working beside it.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from pydantic import BaseModel, ValidationError

from adx.agents._canonical import JsonObject
from adx.agents._graph import (
    _NAME,
    END,
    Budget,
    ExecutableGraphRegistryBuilder,
    Fail,
    Interrupt,
    Join,
    ModelProvider,
    Next,
    NodeWaits,
    Timer,
)
from adx.agents._schemas import JsonSchemaRegistryBuilder
from adx.agents._tools import ReconcileFn, ToolFn
from adx.errors import ConflictError, InvalidInputError

if typing.TYPE_CHECKING:
    from adx.agents._context import NodeContext

__all__ = ["START", "App", "Goto", "apps_in", "registrations", "resolution"]

START = "__start__"
_OBJECT: JsonObject = {"type": "object"}


@dataclass(frozen=True, slots=True)
class Goto:
    """Go to ``node`` (or :data:`END`) next, after merging ``update`` (a model, a dict or None) into the state."""

    node: str
    update: Any = None


Step: TypeAlias = Callable[..., Awaitable[Any]]


def resolution(ctx: NodeContext, wait_id: str) -> Any:
    """The resolution of interrupt ``wait_id`` if this node was woken by it, else None.

    ``if (decision := resolution(ctx, "approve")) is None: return Interrupt("approve", ...)`` waits for an
    approval the first time the node runs and reads it when the run resumes."""
    for wake in ctx.wake or []:
        if wake.wait_id == wait_id and wake.resolved:
            return wake.resolution
    return None


def _dump(value: Any, where: str) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if value is None or isinstance(value, dict):
        return value
    raise InvalidInputError(
        where, f"a node returns a model, a dict, Goto, Interrupt, Timer, Fail or None, not {type(value).__name__}"
    )


@dataclass(frozen=True, slots=True)
class _Node:
    name: str
    fn: Step
    wants_ctx: bool
    next: str | None


class App:
    """One graph, written as decorated functions::

        app = App("support", version=1)

        @app.node
        async def classify(ctx, state: Ticket) -> Ticket | Goto: ...

    Nodes run in declaration order (the first is the entry, the last goes to :data:`END`) unless ``next=``,
    :meth:`add_edge` or :meth:`add_conditional_edges` say otherwise; any node may also return
    ``Goto("other")``. A node takes ``(ctx, state)`` or just ``(state)``; ``state`` is the state model when
    the graph has one (``state=`` or the first node's annotation), else the state dict. It returns the new state
    (a model or a dict, merged into the state), ``Goto``, an ``Interrupt``/``Timer`` to wait on, ``Fail`` or
    None. The terminal artifact is the final state, validated by ``output=`` (default: the state model).
    """

    def __init__(
        self,
        name: str,
        *,
        version: int | str = 1,
        state: type[BaseModel] | None = None,
        input: type[BaseModel] | None = None,
        output: type[BaseModel] | None = None,
        interrupts: Iterable[str] = (),
        budget: Budget | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidInputError("name", f"{name!r} is not a graph name (a letter, then letters, digits, '_.-')")
        if isinstance(version, bool) or not isinstance(version, int | str):
            raise InvalidInputError("version", "must be an integer or a string")
        self.name = name
        self.version = str(version)
        self._state = state
        self._input = input
        self._output = output
        self._interrupts = set(interrupts)
        self._budget = budget
        self._nodes: dict[str, _Node] = {}
        self._edges: dict[str, str] = {}
        self._routes: dict[str, tuple[Callable[[Any], str], tuple[str, ...]]] = {}
        self._entry: str | None = None
        self._tools: list[tuple[str, ToolFn, bool, ReconcileFn | None]] = []
        self._models: list[tuple[str, ModelProvider]] = []

    def __repr__(self) -> str:
        return f"App({self.name!r}, version={self.version!r}, nodes={list(self._nodes)})"

    # -- declaring -------------------------------------------------------------------------------------
    def node(
        self,
        fn: Step | None = None,
        /,
        *,
        name: str | None = None,
        next: str | None = None,
        interrupts: Iterable[str] = (),
    ) -> Any:
        """Decorator: ``@app.node`` or ``@app.node(next="reply", interrupts=["approve"])``."""

        def register(step: Step) -> Step:
            self.add_node(name or step.__name__, step, next=next, interrupts=interrupts)
            return step

        return register(fn) if fn is not None else register

    def add_node(self, name: str, fn: Step, *, next: str | None = None, interrupts: Iterable[str] = ()) -> App:
        if name in self._nodes:
            raise ConflictError(f"graph {self.name!r} already has a node {name!r}")
        if not inspect.iscoroutinefunction(fn):
            raise InvalidInputError(f"nodes.{name}", "must be an async function (async def)")
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) not in (1, 2):
            raise InvalidInputError(f"nodes.{name}", "must take (ctx, state) or (state)")
        self._nodes[name] = _Node(name, fn, len(params) == 2, next)
        self._interrupts.update(interrupts)
        return self

    def add_edge(self, source: str, target: str) -> App:
        """``add_edge(START, "first")`` sets the entry; otherwise a fixed edge (``END`` ends the run)."""
        if source == START:
            self._entry = target
        else:
            self._edges[source] = target
        return self

    def set_entry_point(self, node: str) -> App:
        return self.add_edge(START, node)

    def add_conditional_edges(
        self, source: str, route: Callable[[Any], str], targets: Iterable[str] | Mapping[str, str]
    ) -> App:
        """After ``source``, ``route(state)`` names the next node: one of ``targets`` (or a key of a mapping
        to node names, as in LangGraph)."""
        if isinstance(targets, Mapping):
            mapping = dict(targets)
            self._routes[source] = (lambda state: mapping[route(state)], tuple(dict.fromkeys(mapping.values())))
        else:
            self._routes[source] = (route, tuple(targets))
        return self

    def tool(
        self,
        fn: ToolFn | None = None,
        /,
        *,
        name: str | None = None,
        idempotent: bool = True,
        reconcile: ReconcileFn | None = None,
    ) -> Any:
        """Decorator: ``@app.tool`` or ``@app.tool(idempotent=False, reconcile=find_charge)``; nodes call it with
        ``await ctx.tool("name", args)`` (see docs/agents.md for what each form guarantees)."""

        def register(tool: ToolFn) -> ToolFn:
            self._tools.append((name or str(getattr(tool, "__name__", "")), tool, idempotent, reconcile))
            return tool

        return register(fn) if fn is not None else register

    def model_provider(self, name: str, provider: ModelProvider) -> None:
        self._models.append((name, provider))

    # -- what the registries get ------------------------------------------------------------------------
    @property
    def state_model(self) -> type[BaseModel] | None:
        if self._state is not None:
            return self._state
        for node in self._nodes.values():  # the first node's annotation of its state parameter
            try:
                hints = typing.get_type_hints(node.fn)
            except (NameError, TypeError):  # an annotation that does not resolve: no model, a dict state
                return None
            param = list(inspect.signature(node.fn).parameters)[-1]
            hint = hints.get(param)
            if isinstance(hint, type) and issubclass(hint, BaseModel):
                return hint
            break
        return None

    @property
    def output_model(self) -> type[BaseModel] | None:
        return self._output or self.state_model

    def schema_id(self, role: str) -> str:
        return f"urn:adx-app:{self.name}/{self.version}/{role}"

    def _schema(self, model: type[BaseModel] | None) -> JsonObject:
        return model.model_json_schema() if model is not None else _OBJECT

    def register_schemas(self, schemas: JsonSchemaRegistryBuilder) -> None:
        schemas.register(self.schema_id("input"), self._schema(self._input or self.state_model))
        schemas.register(self.schema_id("output"), self._schema(self.output_model))

    def register_graphs(self, executables: ExecutableGraphRegistryBuilder) -> None:
        if not self._nodes:
            raise InvalidInputError(f"graphs.{self.name}", "has no nodes (decorate an async function with @app.node)")
        for tool_name, fn, idempotent, reconcile in self._tools:
            executables.register_tool(tool_name, fn, idempotent=idempotent, reconcile=reconcile)
        for provider_name, provider in self._models:
            executables.register_model_provider(provider_name, provider)
        names = list(self._nodes)
        entry = self._entry or names[0]
        g = executables.graph(
            self.name,
            self.version,
            entry=entry,
            input_schema=self.schema_id("input"),
            output_schema=self.schema_id("output"),
            budget=self._budget,
            interrupts=sorted(self._interrupts),
        )
        state_model = self.state_model
        # Every node may Goto any node: its route's default is its edge (next=, add_edge, else declaration order).
        anywhere = (*names, END)
        for index, name in enumerate(names):
            node = self._nodes[name]
            g.node(name, self._wrap(node, state_model))
            if name in self._routes:
                route, targets = self._routes[name]
                g.route(name, self._route(route, state_model), targets)
                continue
            default = node.next or self._edges.get(name) or (names[index + 1] if index + 1 < len(names) else END)
            # A default that names no node is kept as a target, so the graph's build names it as the error.
            targets = anywhere if default in anywhere else (*anywhere, default)
            g.route(name, _fixed(default), targets)
        g.terminal(self._terminal())

    def _state_in(self, model: type[BaseModel] | None, state: Any, where: str) -> Any:
        if model is None:
            return state
        try:
            return model.model_validate(state)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "state"
            raise InvalidInputError(f"{where}.{field}", first["msg"]) from None

    def _route(self, route: Callable[[Any], str], model: type[BaseModel] | None) -> Callable[[Any], str]:
        return lambda state: route(self._state_in(model, state, "state"))

    def _wrap(self, node: _Node, model: type[BaseModel] | None) -> Callable[[NodeContext, Any], Awaitable[Any]]:
        where = f"nodes.{node.name}"

        async def run(ctx: NodeContext, state: Any) -> Any:
            value = self._state_in(model, state, "state")
            out = await (node.fn(ctx, value) if node.wants_ctx else node.fn(value))
            if isinstance(out, Goto):
                return Next(_dump(out.update, where), goto=out.node)
            if isinstance(out, Interrupt | Timer | Join):
                return NodeWaits((out,))
            if isinstance(out, Next):
                return Next(_dump(out.update, where), goto=out.goto)
            if isinstance(out, NodeWaits | Fail):
                return out
            return Next(_dump(out, where))

        run.__name__ = node.name
        return run

    def _terminal(self) -> Callable[[Any], Any]:
        output = self.output_model

        def terminal(state: Any) -> Any:
            if output is None:
                return state
            return self._state_in(output, state, "output").model_dump(mode="json")

        return terminal


def _fixed(target: str) -> Callable[[Any], str]:
    return lambda _state: target


def apps_in(module: types.ModuleType) -> list[App]:
    """The :class:`App` objects a module defines at top level, in definition order."""
    return [v for v in vars(module).values() if isinstance(v, App)]


def registrations(apps: Iterable[App], name: str = "adx_apps") -> types.ModuleType:
    """A registrations module (``register_schemas`` and ``register_graphs``) for the worker's loader."""
    chosen = list(apps)
    module = types.ModuleType(name)

    def register_schemas(schemas: JsonSchemaRegistryBuilder) -> None:
        for app in chosen:
            app.register_schemas(schemas)

    def register_graphs(executables: ExecutableGraphRegistryBuilder) -> None:
        for app in chosen:
            app.register_graphs(executables)

    module.register_schemas = register_schemas  # type: ignore[attr-defined]
    module.register_graphs = register_graphs  # type: ignore[attr-defined]
    module.apps = chosen  # type: ignore[attr-defined]
    return module
