"""Field declarations several components' configurations share: each bound and pattern stated once.

The factories return pydantic ``Field`` objects (typed ``Any``, as ``Field`` itself is) so a model still reads
``key: float = seconds(...)``; the generated reference (docs/configuration.md) sees the same bounds as before.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from adx.config._base import join_targets
from adx.model import MAX_CPU_OVERCOMMIT

__all__ = [
    "METRICS_LISTEN_PATTERN",
    "NAME_PATTERN",
    "BaseImageName",
    "CoordinatorTargets",
    "cpu_overcommit_ratio",
    "fraction",
    "seconds",
]

#: What ``base`` is on a node (sandboxd's ``base_image``, ``adx up``'s and its ``--base-image``): the host-derived
#: skeleton, or Debian built from Debian's packages on the first start.
BaseImageName = Literal["host", "debian"]

#: A certificate name (a component's ``name``, a node's name): what ``adx certs issue`` accepts.
NAME_PATTERN = r"^[a-z0-9][a-z0-9.-]{0,62}$"

#: ``host:port`` where Prometheus ``/metrics`` is served (MET-4), or empty: not served.
METRICS_LISTEN_PATTERN = r"^$|^[^\s:]*:\d{1,5}$"

#: The Coordinator's address: ``host:port``; with several replicas (HA) a TOML list, joined into one
#: ``"a:7401,b:7401"`` string (``adx._coordinator_channel`` splits it again).
CoordinatorTargets = Annotated[str, BeforeValidator(join_targets)]


def seconds(default: float, description: str, *, le: float | None = None, ge: float | None = None) -> Any:
    """A duration in seconds: more than 0, or at least ``ge`` when given (``ge=0``: 0 turns it off); at most
    ``le`` when given."""
    if ge is None:
        return Field(default=default, gt=0, le=le, description=description)
    return Field(default=default, ge=ge, le=le, description=description)


def fraction(default: float, description: str) -> Any:
    """A share of a whole: more than 0, at most 1."""
    return Field(default=default, gt=0, le=1, description=description)


def cpu_overcommit_ratio(default: float, description: str) -> Any:
    """RES-4: CPU reservations may reach the CPU capacity times this ratio (memory and disk are never overcommitted);
    1 is none, ``MAX_CPU_OVERCOMMIT`` the most any component accepts."""
    return Field(default=default, ge=1.0, le=MAX_CPU_OVERCOMMIT, description=description)
