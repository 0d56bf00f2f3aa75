"""The graph catalog: workers publish what admitting a run of each of their graphs needs; submitters read it.

A run's descriptor names its graph's digest and its input and output schemas' digests, and its input is
validated against the input schema at admission. Without a catalog the submitting process had to build the
same executable registry as the worker (import the application, register every schema). A worker publishes
each graph's admission contract when it starts (``adx_agent_graph_catalog``, migration 0007); a submitter
rebuilds from it a registry that can admit runs but holds no node code. The driver still checks the graph
digest of every run it claims, so a run admitted from a stale catalog row is refused, never misexecuted.
"""

from __future__ import annotations

import logging
from typing import Any

from psycopg.types.json import Jsonb

from adx.agents._canonical import JsonObject
from adx.agents._graph import Budget, ExecutableGraph, ExecutableGraphRegistry
from adx.agents._schemas import JsonSchemaRegistryBuilder
from adx.agents._store import AgentStore
from adx.errors import NotFoundError

__all__ = ["publish_graphs", "published_registry"]

log = logging.getLogger("adx.agents.catalog")


def _contract(registry: ExecutableGraphRegistry, graph: ExecutableGraph) -> JsonObject:
    schemas = registry.schemas
    return {
        "entry": graph.entry,
        "budget": graph.budget.to_json(),
        "interrupts": list(graph.interrupts),
        "input_schema": {"id": graph.input_schema, "schema": dict(schemas.schema(graph.input_schema))},
        "output_schema": {"id": graph.output_schema, "schema": dict(schemas.schema(graph.output_schema))},
    }


async def publish_graphs(store: AgentStore, registry: ExecutableGraphRegistry) -> int:
    """Publish every graph of ``registry`` (one statement; a republished row becomes the newest)."""
    graphs = registry.graphs()
    if not graphs:
        return 0
    rows = [(g.name, g.version, g.digest, Jsonb(_contract(registry, g))) for g in graphs]
    values = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
    params = [p for row in rows for p in row]
    async with store.transaction("publish graphs", single_statement=True) as conn:
        await conn.execute(
            "INSERT INTO adx_agent_graph_catalog (graph_name, graph_version, graph_digest, descriptor)"
            f" VALUES {values} ON CONFLICT (graph_name, graph_version, graph_digest)"
            " DO UPDATE SET descriptor = EXCLUDED.descriptor, published_at = clock_timestamp()",
            params,
        )
    log.info("published agent graphs", extra={"graphs": [f"{g.name}@{g.version}" for g in graphs]})
    return len(graphs)


async def published_registry(store: AgentStore, name: str, version: str | None) -> ExecutableGraphRegistry:
    """A registry that admits runs of the newest published ``name@version`` (when None: the graph's row published last).

    It holds the graph's contract only: no nodes, tools or models; it can submit, never drive."""
    query = (
        "SELECT graph_name, graph_version, graph_digest, descriptor FROM adx_agent_graph_catalog WHERE graph_name = %s"
    )
    params: list[Any] = [name]
    if version is not None:
        query += " AND graph_version = %s"
        params.append(version)
    async with store.connection("read graph catalog") as conn:
        cur = await conn.execute(query + " ORDER BY published_at DESC LIMIT 1", params)
        row = await cur.fetchone()
    if row is None:
        which = f"{name!r}" + (f" version {version!r}" if version is not None else "")
        raise NotFoundError(
            f"graph {which} is not published in this database: start a worker that serves it"
            " (adx agent dev MODULE, or adx agent worker) before submitting"
        )
    contract = row["descriptor"]
    schemas = JsonSchemaRegistryBuilder.with_default_limits()
    for key in ("input_schema", "output_schema"):  # registering an identical schema twice is a no-op
        schemas.register(contract[key]["id"], contract[key]["schema"])
    graph = ExecutableGraph(
        name=row["graph_name"],
        version=row["graph_version"],
        entry=contract["entry"],
        nodes={},
        edges={},
        routes={},
        terminal=lambda state: state,
        input_schema=contract["input_schema"]["id"],
        output_schema=contract["output_schema"]["id"],
        budget=Budget(**contract["budget"]),
        reducers={},
        interrupts=tuple(contract["interrupts"]),
        digest=row["graph_digest"],
    )
    return ExecutableGraphRegistry(schemas.build(), {(graph.name, graph.version): graph}, {}, {})
