"""What the dashboard tests share besides fixtures (a module of its own: a test cannot import ``conftest`` by name,
since which directory's conftest that finds depends on the collection order)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from playwright.sync_api import Page

__all__ = ["Dashboard", "shot", "sign_in"]


@dataclass(frozen=True)
class Dashboard:
    url: str  # the API server's base URL; the dashboard is at url + "/ui/"
    tenant_key: str
    admin_key: str
    screenshots: Path


def sign_in(page: Page, key: str) -> None:
    page.fill("#key", key)
    page.click("#sign-in")


def shot(page: Page, dashboard: Dashboard, name: str) -> None:
    page.screenshot(path=str(dashboard.screenshots / f"{name}.png"), full_page=True)
