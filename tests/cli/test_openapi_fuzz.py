"""The OpenAPI document tells the truth (issue 17): schemathesis, with all its checks and its stateful phase
through the document's links, finds nothing against a real ``adx up``; the document carries the server's rules
(a schema-valid request is accepted, a schema-violating one refused), request bodies and links."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_helpers import UpCluster

from adx.api._server import create_app
from adx.gateway import ApiConfig

CONFIG = Path(__file__).with_name("schemathesis.toml")
#: The data plane (commands, files, ports) forwards to execd's own API; its operations are not fuzzed here yet.
LIFECYCLE_PATHS = r"^/v1/(environments|agent-runs)"
DATA_PLANE = "(commands|files|ports)"


def _document() -> dict[str, Any]:
    return create_app(ApiConfig()).openapi()


def _walk(node: object) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_schemas_use_json_schema_keywords_only() -> None:
    """pydantic writes a bound it cannot place as a bare `ge`/`le` key, which no client reads (seen on optional
    integers such as lifecycle.lifetimeSeconds): every bound must be minimum/maximum/exclusive*."""
    schemas = _document()["components"]["schemas"]
    leaked = [
        (name, key)
        for name, schema in schemas.items()
        for node in _walk(schema)
        for key in ("ge", "gt", "le", "lt")
        if key in node and isinstance(node[key], int | float)
    ]
    assert not leaked, leaked


def test_bodies_and_links_are_published() -> None:
    doc = _document()
    paths = doc["paths"]
    for path in ("/v1/environments/{environment_id}/lifetime", "/v1/environments/{environment_id}/network"):
        body = paths[path]["post"]["requestBody"]
        assert body["required"] is True
        ref = body["content"]["application/json"]["schema"]["$ref"]
        assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"]
    links = paths["/v1/environments"]["post"]["responses"]["201"]["links"]
    targets = {
        operation["operationId"]
        for path, methods in paths.items()
        if "{environment_id}" in path
        for operation in methods.values()
    }
    assert targets and set(links) == targets
    assert all(link["parameters"]["environment_id"] == "$response.body#/id" for link in links.values())


def _cleanup(api_url: str, api_key: str) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=api_url, headers=headers, timeout=60) as client:
        for env in client.get("/v1/environments").json()["environments"]:
            if env["state"] not in ("deleting", "deleted"):
                client.delete(f"/v1/environments/{env['id']}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing(up_cluster: UpCluster, tmp_path: Path) -> None:
    credentials = json.loads((up_cluster.config_home / "adx" / "credentials.json").read_text())
    schemathesis = Path(sys.executable).with_name("schemathesis")
    command = [
        str(schemathesis),
        "--config-file",
        str(CONFIG),
        "run",
        f"{credentials['api_url']}/openapi.json",
        "--header",
        f"Authorization: Bearer {credentials['api_key']}",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        "10",
        "--seed",
        "1",
        "--include-path-regex",
        LIFECYCLE_PATHS,
        "--exclude-path-regex",
        DATA_PLANE,
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    finally:
        _cleanup(credentials["api_url"], credentials["api_key"])
    summary = done.stdout[-6000:]
    assert done.returncode == 0, summary
    assert "No issues found" in done.stdout or " passed" in done.stdout, summary


def test_agent_runs_answer_under_adx_up(up_cluster: UpCluster) -> None:
    """`adx up` runs PostgreSQL, so its API server serves the agent runs (schemathesis saw every /v1/agent-runs
    operation answer 503 "not configured"): the store is migrated at start and the routes answer."""
    credentials = json.loads((up_cluster.config_home / "adx" / "credentials.json").read_text())
    headers = {"Authorization": f"Bearer {credentials['api_key']}"}
    listed = httpx.get(f"{credentials['api_url']}/v1/agent-runs", headers=headers, timeout=30)
    assert listed.status_code == 200, listed.text
    assert listed.json() == {"runs": [], "nextCursor": None}
    missing = httpx.get(f"{credentials['api_url']}/v1/agent-runs/{'0' * 32}", headers=headers, timeout=30)
    assert missing.status_code == 404, missing.text
