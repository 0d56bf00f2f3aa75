"""Fixtures of the dashboard tests: a real ``adx up`` (tests/helpers/cli_helpers.py: every daemon a real process) and
Debian's chromium driven headless by Playwright (``executable_path``: Playwright downloads no browser).

Screenshots of every test go to one temporary directory, printed at the end of the run, or to
``$ADX_UI_SCREENSHOTS`` when set (pytest removes all but its last three temporary roots, which other runs on a
shared machine may turn over)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import UpCluster, up_cluster
from playwright.sync_api import Browser, sync_playwright

__all__ = ["up_cluster"]

_ARTIFACTS: list[Path] = []


@dataclass(frozen=True)
class Dashboard:
    url: str  # the API server's base URL; the dashboard is at url + "/ui/"
    tenant_key: str
    admin_key: str
    screenshots: Path


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for path in _ARTIFACTS:
        terminalreporter.write_line(f"dashboard screenshots: {path}")
