"""``adx up`` as a user runs it (a real subprocess: Redis, Coordinator, node, sandboxd, API + Ingress), and two
tenants' keys for the real ``e2b`` SDK, which reaches it through ``E2B_API_URL`` / ``E2B_SANDBOX_URL``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox
from e2b_up import Up, running_up


@pytest.fixture(scope="session")
def adx_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with running_up(tmp_path_factory.mktemp("e2b-up")) as up:
        yield up


@pytest.fixture
def sandbox(adx_up: Up) -> Iterator[Sandbox]:
    """A sandbox of the default template (a module may define its own ``sandbox``, which wins)."""
    made = Sandbox.create(**adx_up.opts())
    yield made
    made.kill()
