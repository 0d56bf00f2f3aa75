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
from xml.etree import ElementTree

import httpx
import pytest
from cli_helpers import UpCluster

from adx.api._server import create_app
from adx.gateway import ApiConfig

CONFIG = Path(__file__).with_name("schemathesis.toml")
#: The routes fuzzed with the admin key (in a second run, after the tenant's).
ADMIN_PATHS = "/v1/admin"


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


#: Answers that are bytes, not JSON: a file's contents, a user port's service (whatever it serves).
RAW = {"application/octet-stream", "*/*"}


def test_every_operation_has_a_typed_answer() -> None:
    """Issue 17: the command and file routes published an empty response schema. Every success answer now has a
    schema (JSON or NDJSON lines), is raw bytes by nature, or has no body (204); every JSON request body too."""
    doc = _document()
    untyped = []
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            success = {code: r for code, r in operation["responses"].items() if code.startswith("2")}
            assert success, f"{method} {path}"
            for code, response in success.items():
                content = response.get("content", {})
                if code == "204" or (content and set(content) <= RAW) or method == "head":
                    continue
                if not content or any(not media.get("schema") for media in content.values()):
                    untyped.append(f"{method.upper()} {path} {code}")
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None and not body.get("schema"):
                untyped.append(f"{method.upper()} {path} body")
    assert not untyped, untyped


def _cleanup(api_url: str, api_key: str) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=api_url, headers=headers, timeout=60) as client:
        for env in client.get("/v1/environments").json()["environments"]:
            if env["state"] not in ("deleting", "deleted"):
                client.delete(f"/v1/environments/{env['id']}")


def _operations(doc: dict[str, Any], admin: bool) -> set[str]:
    """The document's operations (``METHOD /path``) one run covers: the admin routes, or every other one."""
    return {
        f"{method.upper()} {path}"
        for path, methods in doc["paths"].items()
        for method in methods
        if path.startswith(ADMIN_PATHS) == admin
    }


def _fuzz(api_url: str, key: str, report: Path, *, admin: bool) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """One schemathesis run (all checks, every phase, the stateful one through the links); returns its process and
    the operations its JUnit report says it tested (a test case per operation reached)."""
    report.mkdir()
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(CONFIG),
        "run",
        f"{api_url}/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        "10",
        "--seed",
        "1",
        "--include-path-regex" if admin else "--exclude-path-regex",
        f"^{ADMIN_PATHS}",
        "--report",
        "junit",
        "--report-junit-path",
        str(report / "junit.xml"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=report)
    (report / "stdout.txt").write_text(done.stdout)
    cases = ElementTree.parse(report / "junit.xml").getroot().iter("testcase")
    return done, {case.attrib["name"] for case in cases} - {"Stateful tests"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing(up_cluster: UpCluster, tmp_path: Path) -> None:
    """Every operation but the admin ones is reached with the tenant's key (the data plane, endpoint tokens and
    logs included) and none answers against its schema or with a server error."""
    credentials = json.loads((up_cluster.config_home / "adx" / "credentials.json").read_text())
    api_url = credentials["api_url"]
    doc = httpx.get(f"{api_url}/openapi.json", timeout=30).json()
    try:
        done, reached = _fuzz(api_url, credentials["api_key"], tmp_path / "tenant", admin=False)
    finally:
        _cleanup(api_url, credentials["api_key"])
    assert done.returncode == 0, done.stdout[-6000:]
    assert reached == _operations(doc, admin=False), done.stdout[-3000:]


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


def _restore_nodes(api_url: str, admin_key: str) -> None:
    headers = {"Authorization": f"Bearer {admin_key}"}
    with httpx.Client(base_url=api_url, headers=headers, timeout=60) as client:
        for node in client.get("/v1/admin/nodes").json():
            client.post(f"/v1/admin/nodes/{node['name']}/uncordon").raise_for_status()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing_in_admin(up_cluster: UpCluster, tmp_path: Path) -> None:
    """The admin routes, with the admin key: every one reached, nothing found. Last in this module: schemathesis
    reuses names it saw in answers, so it disables, enables and rotates the keys of `adx up`'s own tenant, and it
    may cordon or drain the node (uncordoned after)."""
    credentials = json.loads((up_cluster.config_home / "adx" / "credentials.json").read_text())
    admin_key = json.loads((up_cluster.state / "admin.json").read_text())["admin_key"]
    api_url = credentials["api_url"]
    doc = httpx.get(f"{api_url}/openapi.json", timeout=30).json()
    try:
        done, reached = _fuzz(api_url, admin_key, tmp_path / "admin", admin=True)
    finally:
        _restore_nodes(api_url, admin_key)
    assert done.returncode == 0, done.stdout[-6000:]
    assert reached == _operations(doc, admin=True), done.stdout[-3000:]
