"""The web dashboard at /ui, in headless Chromium against a real ``adx up``: sign-in with a tenant key (kept in
sessionStorage, never in a URL) or the admin key, the Environments page creating, pausing, resuming and deleting
a real sandbox while the state shown follows, the Nodes page from the admin API, the Agent runs page, and a wrong
key refused with the API's reason. Each test saves screenshots (the run prints their directory) and fails on any
script error or CSP violation in the page."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cli_helpers import ADX, UpCluster
from playwright.sync_api import Page, expect
from ui_helpers import Dashboard, shot, sign_in

from adx.api._ui import CSP

pytestmark = pytest.mark.slow

#: Creating runs a real sandbox, pause checkpoints it: generous for a loaded 2-core machine.
STATE_TIMEOUT_MS = 90_000


def test_served_with_a_strict_csp_from_a_fixed_list_of_files(dashboard: Dashboard) -> None:
    with httpx.Client(base_url=dashboard.url, timeout=30) as http:
        root = http.get("/ui")
        assert root.status_code == 308 and root.headers["location"] == "/ui/"
        index = http.get("/ui/")
        assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
        assert index.headers["content-security-policy"] == CSP
        assert "script-src 'self';" in CSP and "unsafe" not in CSP
        assert index.headers["x-frame-options"] == "DENY" and index.headers["x-content-type-options"] == "nosniff"
        # No inline script or style: the CSP would block them, so none may be needed.
        assert not re.search(r"<script(?![^>]*\bsrc=)", index.text) and " style=" not in index.text
        for name in ("app.js", "terminal.js"):
            script = http.get(f"/ui/{name}")
            assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
            assert "innerHTML" not in script.text and "eval(" not in script.text, name
        for path in ("/ui/missing.js", "/ui/..%2Fpyproject.toml", "/ui/_ui.py"):
            missing = http.get(path)
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found", path
        # The dashboard is no API operation: it stays out of the OpenAPI document.
        assert not [p for p in http.get("/openapi.json").json()["paths"] if p.startswith("/ui")]


def test_a_wrong_key_is_refused_with_the_apis_reason_and_nothing_is_kept(page: Page, dashboard: Dashboard) -> None:
    sign_in(page, "adxk_not-a-real-key")
    error = page.locator("#login-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("401")
    expect(error).to_contain_text("unknown API key")
    shot(page, dashboard, "wrong-tenant-key")
    assert page.evaluate("sessionStorage.length") == 0
    expect(page.locator("#nav")).to_be_hidden()
    sign_in(page, "adxa_not-a-real-admin-key")
    expect(error).to_contain_text("unknown admin key")
    assert page.evaluate("sessionStorage.length") == 0


def test_create_running_pause_paused_resume_delete(page: Page, dashboard: Dashboard) -> None:
    """The issue's must-show: an Environment created from the dashboard is seen running, is paused, and the state
    shown follows (then resume and delete)."""
    sign_in(page, dashboard.tenant_key)
    expect(page.locator("#page-environments")).to_be_visible()
    assert dashboard.tenant_key not in page.url
    assert page.evaluate("sessionStorage.getItem('adx.key')") == dashboard.tenant_key
    page.fill("#create-cpu", "0.25")
    page.fill("#create-memory", "128")
    page.fill("#create-entrypoint", "sleep infinity")
    page.fill("#create-idle", "600")
    page.select_option("#create-idle-action", "pause")
    page.fill("#create-lifetime", "3600")
    page.click("#create")
    row = page.locator("#envs tbody tr").first
    expect(row).to_be_visible()
    env_id = row.get_attribute("data-env-id")
    assert env_id and env_id.startswith("env")
    state = page.locator(f'tr[data-env-id="{env_id}"] .state')
    expect(state).to_have_attribute("data-state", "running", timeout=STATE_TIMEOUT_MS)
    this = page.locator(f'tr[data-env-id="{env_id}"]')
    expect(this).to_contain_text("pause after 10m idle")
    expect(this).to_contain_text(re.compile(r"delete at .*\d{4}"))  # the lifetime deadline, with its date
    expect(this.locator('[data-action="pause"]')).to_be_enabled()
    expect(this.locator('[data-action="resume"]')).to_be_disabled()
    # The usage sparklines fill from the node's samples (/stats) while it runs: CPU and memory, each drawn.
    sparks = this.locator("svg.spark")
    expect(sparks).to_have_count(2, timeout=STATE_TIMEOUT_MS)
    expect(sparks.first).not_to_have_attribute("data-points", "0")
    expect(this.locator("svg.spark :is(polyline, circle)")).to_have_count(2)
    expect(this.locator("td.usage").nth(1)).to_contain_text(re.compile(r"\d(\.\d)?(B|Ki|Mi|Gi)$"))
    shot(page, dashboard, "environment-running")

    this.locator('[data-action="pause"]').click()
    expect(state).to_have_attribute("data-state", "paused", timeout=STATE_TIMEOUT_MS)
    expect(this.locator('[data-action="resume"]')).to_be_enabled()
    expect(this.locator('[data-action="pause"]')).to_be_disabled()
    shot(page, dashboard, "environment-paused")
    # The page shows what the API holds.
    with httpx.Client(base_url=dashboard.url, timeout=30) as http:
        held = http.get(f"/v1/environments/{env_id}", headers={"Authorization": f"Bearer {dashboard.tenant_key}"})
        assert held.json()["state"] == "paused"

    this.locator('[data-action="resume"]').click()
    expect(state).to_have_attribute("data-state", "running", timeout=STATE_TIMEOUT_MS)
    shot(page, dashboard, "environment-resumed")

    delete = this.locator('[data-action="delete"]')
    delete.click()
    expect(delete).to_have_text("Confirm delete")  # two steps: a delete cannot be undone
    delete.click()
    expect(page.locator(f'tr[data-env-id="{env_id}"]')).to_have_count(0, timeout=STATE_TIMEOUT_MS)
    shot(page, dashboard, "environment-deleted")


def test_a_refused_create_shows_the_field(page: Page, dashboard: Dashboard) -> None:
    sign_in(page, dashboard.tenant_key)
    page.fill("#create-image", "no-such-image")
    page.click("#create")
    error = page.locator("#create-error")
    expect(error).to_contain_text("422")
    expect(error).to_contain_text("image")
    shot(page, dashboard, "create-refused")


def test_the_admin_sees_nodes_with_capacity_and_admission(page: Page, dashboard: Dashboard) -> None:
    sign_in(page, dashboard.admin_key)
    expect(page.locator("#page-nodes")).to_be_visible()  # the admin lands on Nodes
    node = page.locator("#nodes tbody tr").first
    expect(node).to_be_visible()
    expect(node.locator(".health")).to_have_text("ready")
    expect(node.locator(".admission")).to_have_text("open")
    expect(node).to_contain_text(re.compile(r"\d(\.\d+)? CPU, [\d.]+(Mi|Gi|Ti) mem"))
    expect(page.locator("#cluster-summary")).to_contain_text("1 node(s)")
    shot(page, dashboard, "nodes")
    # Environments and agent runs belong to tenants: the admin is told to use a tenant key.
    page.click('#nav a[data-page="environments"]')
    expect(page.locator("#envs-unavailable")).to_be_visible()
    page.click("#sign-out")
    expect(page.locator("#login")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0


def test_a_tenant_sees_agent_runs_and_is_told_nodes_need_the_admin(page: Page, dashboard: Dashboard) -> None:
    sign_in(page, dashboard.tenant_key)
    page.click('#nav a[data-page="runs"]')
    expect(page.locator("#page-runs")).to_be_visible()
    # `adx up` gives the API server its agent store: the list answers, not 'not available'.
    expect(page.locator("#runs")).to_be_visible()
    expect(page.locator("#runs-unavailable")).to_be_hidden()
    expect(page.locator("#runs-error")).to_be_hidden()
    shot(page, dashboard, "agent-runs")
    page.click('#nav a[data-page="nodes"]')
    expect(page.locator("#nodes-unavailable")).to_be_visible()


AGENT_APP = """
from adx.agents import App

app = App("ui-hello", version=1)


@app.node
async def greet(state: dict) -> dict:
    return {"greeting": "hello " + state["name"]}


@app.node
async def finish(state: dict) -> dict:
    return {"done": True}
"""

SUBMIT = """
import asyncio, sys
from adx.agents import Client


async def main() -> None:
    async with await Client.connect(sys.argv[1], tenant="default") as client:
        run = await client.submit("ui-hello", {"name": "ann"}, version=1)
        done = await client.wait(run, timeout=90)
        print(run.run_id, done.status)


asyncio.run(main())
"""


def _postgres_url(state: Path) -> str:
    for info in state.rglob("server.json"):
        record = json.loads(info.read_text())
        if record.get("kind") == "postgres":
            return str(record["url"])
    raise AssertionError(f"no PostgreSQL server.json under {state}")


@pytest.fixture
def agent_run(up_cluster: UpCluster, tmp_path: Path) -> Iterator[str]:
    """One finished run of the default tenant on the cluster's own PostgreSQL: a real worker (`adx agent dev` on
    that database) runs a two-node graph that a client submitted; the run ID."""
    url = _postgres_url(up_cluster.state)
    (tmp_path / "ui_agent.py").write_text(AGENT_APP)
    (tmp_path / "submit.py").write_text(SUBMIT)
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [*ADX, "agent", "dev", "ui_agent", "--database-url", url, "--tenant", "default", "--state-dir", "dev"],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=up_cluster.env(),
    )
    try:
        deadline = time.monotonic() + 60
        while "serving" not in (tmp_path / "worker.log").read_text():
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.2)
        submitted = subprocess.run(
            [sys.executable, "submit.py", url], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert submitted.returncode == 0, submitted.stderr
        run_id, status = submitted.stdout.split()
        assert status == "succeeded", submitted.stdout
        yield run_id
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()


def test_agent_runs_list_and_history(page: Page, dashboard: Dashboard, agent_run: str) -> None:
    sign_in(page, dashboard.tenant_key)
    page.click('#nav a[data-page="runs"]')
    row = page.locator(f'#runs tr[data-run="{agent_run}"]')
    expect(row).to_be_visible()
    expect(row).to_contain_text("ui-hello@1")
    expect(row.locator(".status")).to_have_text("succeeded")
    row.locator("button").click()
    history = page.locator("#run-history")
    expect(history).to_be_visible()
    expect(page.locator("#run-history-id")).to_have_text(agent_run)
    events = history.locator("tbody tr")
    expect(events.last).to_contain_text("succeeded")
    expect(history).to_contain_text("node_committed")
    shot(page, dashboard, "agent-run-history")
