"""Every relative link in the README and docs/ names a file of the repository (issue 17: the README linked
files that a clone does not have), and every docs page is reachable from the docs index."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(page: Path) -> list[str]:
    links = [target.split("#", 1)[0] for target in LINK.findall(page.read_text())]
    return [link for link in links if link and "://" not in link and not link.startswith("mailto:")]


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_relative_links_resolve_inside_the_repository(page: Path) -> None:
    for link in _relative_links(page):
        target = (page.parent / link).resolve()
        assert target.is_relative_to(ROOT), f"{page.name} links outside the repository: {link}"
        assert target.exists(), f"{page.name} links to a missing file: {link}"


def test_every_docs_page_is_in_the_index() -> None:
    linked = {(ROOT / "docs" / link).resolve() for link in _relative_links(ROOT / "docs" / "index.md")}
    missing = [page.name for page in PAGES[1:] if page.name != "index.md" and page.resolve() not in linked]
    assert not missing, f"docs/index.md does not link {missing}"
