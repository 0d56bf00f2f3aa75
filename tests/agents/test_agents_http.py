"""Agent runs over HTTP on the real API server (``/v1/agent-runs``): tenant-authenticated, typed, documented.

The API server runs under uvicorn with a real Coordinator on a real Redis (tests/helpers/apistack.py) for the
tenant API keys, and reads runs from a real PostgreSQL through ADX_AGENT_DATABASE_URL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from agents_helpers import TENANT, make_scheduler
from apistack import api_stack  # noqa: F401 (fixture)

from adx.agents import AgentRuns, AgentStore, ExecutableGraphRegistry


@pytest.mark.req("AGT-16", "SEC-2")
async def test_agent_runs_over_http(
    store: AgentStore,
    executables: ExecutableGraphRegistry,
    postgres_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    api_stack: Callable[..., Awaitable[Any]],  # noqa: F811
) -> None:
    monkeypatch.setenv("ADX_AGENT_DATABASE_URL", postgres_dsn)
    stack = await api_stack()
    key = await stack.tenant(TENANT)
    other = await stack.tenant("other")
    runs = AgentRuns(store, executables)
    done = await runs.submit(TENANT, "chain", "1", {"count": 0})
    await make_scheduler(store, executables).tick()
    order = await runs.submit(TENANT, "order", "1", {"amount": 4})

    async with stack.http(key) as http:
        listed = await http.get("/v1/agent-runs")
        assert listed.status_code == 200, listed.text
        body = listed.json()
        assert [r["runId"] for r in body["runs"]] == [str(order.run_id), str(done.run_id)]  # newest first
        assert body["nextCursor"] is None and body["runs"][1]["status"] == "succeeded"
        assert body["runs"][0]["graphVersion"] == "1" and body["runs"][0]["usage"]["nodeCommits"] == 0
        page = await http.get("/v1/agent-runs", params={"limit": 1})
        assert page.json()["nextCursor"]
        rest = await http.get("/v1/agent-runs", params={"limit": 1, "cursor": page.json()["nextCursor"]})
        assert [r["runId"] for r in rest.json()["runs"]] == [str(done.run_id)]
        bad = await http.get("/v1/agent-runs", params={"status": "finished"})
        assert bad.status_code == 422 and bad.json()["error"]["details"]["field"] == "status"

        one = await http.get(f"/v1/agent-runs/{done.run_id}")
        assert one.status_code == 200
        assert one.json()["result"]["artifact"] == {"count": 10} and one.json()["finishedAt"]
        history = await http.get(f"/v1/agent-runs/{done.run_id}/history")
        kinds = [e["kind"] for e in history.json()["events"]]
        assert kinds.count("node_committed") == 10 and kinds[-1] == "succeeded"

        typo = await http.post(f"/v1/agent-runs/{order.run_id}/interrupts/aprove/resolve", json={"resolution": 1})
        assert typo.status_code == 422 and typo.json()["error"]["details"]["field"] == "wait_id"
        early = await http.post(
            f"/v1/agent-runs/{order.run_id}/interrupts/approve/resolve", json={"resolution": {"by": "ann"}}
        )
        assert early.status_code == 200 and early.json()["outcome"] == "stored_early"
        fork = await http.post(f"/v1/agent-runs/{done.run_id}/fork", json={"checkpointSeq": 4})
        assert (
            fork.status_code == 201 and fork.json()["status"] == "queued" and fork.json()["runId"] != str(done.run_id)
        )
        bad_fork = await http.post(f"/v1/agent-runs/{done.run_id}/fork", json={"checkpointSeq": -1})
        assert bad_fork.status_code == 422 and "checkpointSeq" in bad_fork.text
        retry = await http.post(f"/v1/agent-runs/{done.run_id}/retry")
        assert retry.status_code == 409 and "only a failed run" in retry.json()["error"]["message"]
        cancel = await http.post(f"/v1/agent-runs/{order.run_id}/cancel")
        assert cancel.status_code == 200 and cancel.json()["cancelRequested"] is True
        assert (await http.get("/v1/agent-runs/not-a-uuid")).status_code == 404

    # SEC-2: another tenant sees none of it, with the same 404 as a missing run.
    async with stack.http(other) as http:
        assert (await http.get("/v1/agent-runs")).json()["runs"] == []
        fork = await http.post(f"/v1/agent-runs/{done.run_id}/fork", json={"checkpointSeq": 4})
        assert fork.status_code == 404
        foreign = await http.get(f"/v1/agent-runs/{done.run_id}")
        assert foreign.status_code == 404 and str(done.run_id) in foreign.json()["error"]["message"]
        assert (await http.post(f"/v1/agent-runs/{order.run_id}/cancel")).status_code == 404
        resolve = await http.post(f"/v1/agent-runs/{order.run_id}/interrupts/approve/resolve", json={})
        assert resolve.status_code == 404
    async with stack.http(None) as http:
        assert (await http.get("/v1/agent-runs")).status_code == 401
    async with stack.http(key) as http:
        spec = (await http.get("/openapi.json")).json()
    assert "/v1/agent-runs/{run_id}/interrupts/{wait_id}/resolve" in spec["paths"]
    assert {"AgentRunView", "AgentRunList", "ResolveResponse"} <= set(spec["components"]["schemas"])
