"""Fixtures of the dashboard tests: a real ``adx up`` (tests/helpers/cli_helpers.py: every daemon a real process) and
Debian's chromium driven headless by Playwright (``executable_path``: Playwright downloads no browser).

Screenshots of every test go to one temporary directory, printed at the end of the run, or to
``$ADX_UI_SCREENSHOTS`` when set (pytest removes all but its last three temporary roots, which other runs on a
shared machine may turn over)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import UpCluster, up_cluster
from playwright.sync_api import Browser, Page, sync_playwright
from ui_helpers import Dashboard

__all__ = ["up_cluster"]

_ARTIFACTS: list[Path] = []


@pytest.fixture(scope="module")
def dashboard(up_cluster: UpCluster, tmp_path_factory: pytest.TempPathFactory) -> Dashboard:
    state = up_cluster.state
    chosen = os.environ.get("ADX_UI_SCREENSHOTS")
    shots = Path(chosen) if chosen else tmp_path_factory.mktemp("ui-screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    _ARTIFACTS.append(shots)
    return Dashboard(
        url=json.loads((state / "cluster.json").read_text())["api_url"],
        tenant_key=json.loads((state / "credentials.json").read_text())["api_key"],
        admin_key=json.loads((state / "admin.json").read_text())["admin_key"],
        screenshots=shots,
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is missing: scripts/bootstrap.sh installs it (apt-get install chromium)")
    with sync_playwright() as p:
        # --no-sandbox: chromium's own sandbox refuses to start as root, which these tests run as.
        b = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


#: The browser logs every API refusal the page shows (a wrong key's 401, a refused create's 422) as a failed
#: resource: those are answers the tests ask for. A missing file (404), a script error or a CSP violation
#: ("Refused to ...") is not.
API_REFUSAL = re.compile(
    r"^console error: Failed to load resource: the server responded with a status of (401|409|422)"
)


@pytest.fixture
def page(browser: Browser, dashboard: Dashboard, request: pytest.FixtureRequest) -> Iterator[Page]:
    """The dashboard in a new browser context; fails the test on any script error, CSP violation, missing file
    or key in a requested URL, and saves a screenshot of the end."""
    context = browser.new_context(viewport={"width": 1500, "height": 900})
    page = context.new_page()
    problems: list[str] = []
    requested: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    # A CSP violation (or any script error) is reported on the console as an error.
    page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("request", lambda req: requested.append(req.url))
    page.goto(f"{dashboard.url}/ui")
    yield page
    page.screenshot(path=str(dashboard.screenshots / f"{request.node.name}-end.png"), full_page=True)
    context.close()
    for url in requested:
        assert dashboard.tenant_key not in url and dashboard.admin_key not in url, url
    unexpected = [p for p in problems if not API_REFUSAL.search(p)]
    assert not unexpected, unexpected


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for path in _ARTIFACTS:
        terminalreporter.write_line(f"dashboard screenshots: {path}")
