"""Declaring a graph: what the builder refuses (naming the field), and a digest that does not drift (AGT-1)."""

from __future__ import annotations

from typing import Any

import pytest

from adx.agents import (
    END,
    Budget,
    ExecutableGraphRegistryBuilder,
    GraphBuilder,
    JsonSchemaRegistryBuilder,
    NodeContext,
)
from adx.errors import ConflictError, InvalidInputError

IN, OUT = "urn:adx-test:schema:in:1.0.0", "urn:adx-test:schema:out:1.0.0"


async def node(ctx: NodeContext, state: Any) -> None:
    return None


def registry() -> ExecutableGraphRegistryBuilder:
    schemas = JsonSchemaRegistryBuilder.with_default_limits()
    schemas.register(IN, {"type": "object"})
    schemas.register(OUT, {"type": "object"})
    return ExecutableGraphRegistryBuilder(schemas.build())


def two_nodes(ex: ExecutableGraphRegistryBuilder, **contract: Any) -> GraphBuilder:
    declared = {"entry": "x", "input_schema": IN, "output_schema": OUT, **contract}
    return ex.graph("g", "1", **declared).node("x", node).node("y", node).terminal(lambda s: s)


@pytest.mark.parametrize("second", ["edge", "route"])
@pytest.mark.parametrize("first", ["edge", "route"])
def test_a_node_leaves_by_one_edge_or_one_route(first: str, second: str) -> None:
    g = two_nodes(registry())
    leave = {"edge": lambda: g.edge("x", "y"), "route": lambda: g.route("x", lambda s: "y", ["y"])}
    leave[first]()
    with pytest.raises(ConflictError, match="'x' already has an outgoing edge or route"):
        leave[second]()


@pytest.mark.parametrize(
    ("contract", "field"),
    [
        ({"entry": "z"}, "graphs.g.entry"),
        ({"input_schema": "urn:adx-test:schema:nope:1.0.0"}, "graphs.g.input_schema"),
        ({"output_schema": "urn:adx-test:schema:nope:1.0.0"}, "graphs.g.output_schema"),
    ],
)
def test_build_names_the_declaration_it_refuses(contract: dict[str, str], field: str) -> None:
    ex = registry()
    two_nodes(ex, **contract).edge("x", "y").edge("y", END)
    with pytest.raises(InvalidInputError) as err:
        ex.build()
    assert err.value.field == field


def test_the_graph_digest_is_stable() -> None:
    """A run admitted under a digest is only driven by a registry whose graph has that digest: the same
    declaration must keep producing the same digest from one build of the runtime to the next (the value was
    computed by the builder before its declaration became a typed contract)."""
    ex = registry()
    g = two_nodes(ex, budget=Budget(max_steps=7), interrupts=["b", "a", "a"])
    g.edge("x", "y").route("y", lambda s: END, [END, "x"])
    built = ex.build().get("g", "1")
    assert built.interrupts == ("a", "b")
    assert built.budget == Budget(max_steps=7)
    assert built.digest == "sha256:b8180893ba86f41f0b0bc79d3f412a35325efe6849c8d4ea3599210951d319fa"
