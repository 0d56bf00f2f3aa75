"""OpenAPI links: which response supplies which path parameter, so a stateful client (or a schema-driven fuzzer)
can go from creating or listing an Environment, or listing agent runs, to every operation on one of them; from
starting a background command to every operation on it; from creating a tenant to its keys; from the node list to
every node operation.

Links are derived from the paths, not written per route: every operation whose path has a parameter named here
gets a link from each operation that supplies it, so a new route is linked without anyone remembering to.
"""

from __future__ import annotations

from dataclasses import dataclass

from adx.gateway import OpenApiObject

__all__ = ["SOURCES", "add_links"]

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


@dataclass(frozen=True)
class Source:
    """A response that carries a value of a path parameter, at a JSON pointer of its body."""

    method: str
    path: str
    status: str
    pointer: str  # a runtime expression: $response.body#/...


SOURCES: dict[str, tuple[Source, ...]] = {
    "environment_id": (
        Source("post", "/v1/environments", "201", "$response.body#/id"),
        Source("get", "/v1/environments", "200", "$response.body#/environments/0/id"),
    ),
    "token_id": (Source("post", "/v1/environments/{environment_id}/tokens", "201", "$response.body#/id"),),
    "command_id": (
        Source("post", "/v1/environments/{environment_id}/commands", "201", "$response.body#/id"),
        Source("get", "/v1/environments/{environment_id}/commands", "200", "$response.body#/commands/0/id"),
    ),
    # Admin: only tenants a client created itself (never the list's first: a client following links must not
    # disable or rotate the keys of a tenant it does not know); the nodes are the cluster's own.
    "name": (Source("post", "/v1/admin/tenants", "201", "$response.body#/owner"),),
    "key_id": (
        Source("post", "/v1/admin/tenants", "201", "$response.body#/keyId"),
        Source("post", "/v1/admin/tenants/{name}/keys", "201", "$response.body#/keyId"),
    ),
    "node": (Source("get", "/v1/admin/nodes", "200", "$response.body#/0/name"),),
    "run_id": (Source("get", "/v1/agent-runs", "200", "$response.body#/runs/0/runId"),),
    "wait_id": (Source("get", "/v1/agent-runs/{run_id}", "200", "$response.body#/waits/0/waitId"),),
}


def add_links(schema: OpenApiObject) -> None:
    """Add ``links`` to the source responses of ``schema`` (an OpenAPI document), in place."""
    paths: dict[str, OpenApiObject] = schema.get("paths", {})
    for path, operations in paths.items():
        for method in _METHODS:
            target = operations.get(method)
            if target is None or "operationId" not in target:
                continue
            params = [p["name"] for p in target.get("parameters", []) if p.get("in") == "path"]
            for name in params:
                for source in SOURCES.get(name, ()):
                    if (source.method, source.path) == (method, path):
                        continue
                    response = paths.get(source.path, {}).get(source.method, {}).get("responses", {})
                    if source.status not in response:
                        continue
                    links = response[source.status].setdefault("links", {})
                    link = links.setdefault(target["operationId"], {"operationId": target["operationId"]})
                    link.setdefault("parameters", {})[name] = source.pointer
                    # Parameters another source of this link already supplies (e.g. run_id beside wait_id).
                    for other in params:
                        if other != name and other in _carried_by(source):
                            link["parameters"][other] = f"$request.path.{other}"


def _carried_by(source: Source) -> set[str]:
    """The path parameters of the source's own request: a link may pass them on unchanged."""
    return {part[1:-1] for part in source.path.split("/") if part.startswith("{") and part.endswith("}")}
