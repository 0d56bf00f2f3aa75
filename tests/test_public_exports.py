"""Every package's public surface is honest: each name in ``__all__`` resolves (lazy exports included), none is
listed twice, and every package has one (trio keeps its exports honest the same way)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import adx

PACKAGES = sorted(
    info.name
    for info in pkgutil.walk_packages(adx.__path__, "adx.")
    if info.ispkg and not info.name.rsplit(".", 1)[1].startswith("_") and not info.name.startswith("adx.proto")
)
#: Packages with no public Python surface, and why.
WITHOUT_ALL = {"adx.execd": "runs inside every sandbox as `python -m adx.execd`; its __init__ stays empty (memory)"}


def test_the_packages_are_found() -> None:
    assert {"adx.api", "adx.gateway", "adx.node", "adx.sandboxd", "adx.sdk"} <= set(PACKAGES)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_resolve(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if name in WITHOUT_ALL:
        return
    assert exported is not None, f"{name} has no __all__"
    assert len(exported) == len(set(exported)), f"{name}.__all__ lists a name twice"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not have: {missing}"
