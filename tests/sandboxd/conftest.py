"""sandboxd test fixtures (helpers live in sbx_helpers)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory


@pytest.fixture(scope="session")
def sandbox_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One default image for the session: it is a read-only lower layer, so daemons may share it."""
    return tmp_path_factory.mktemp("sandbox-images")


@pytest.fixture
def sandboxd(tmp_path: Path, sandbox_images: Path) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(tmp_path, sandbox_images)
    try:
        yield factory
    finally:
        factory.cleanup()


# Namespaces, cgroups and overlayfs need root; elsewhere these tests cannot run (and must not pretend to).
if os.geteuid() != 0:
    collect_ignore_glob = ["test_*.py"]
