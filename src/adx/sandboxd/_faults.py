"""Test-only fault points of sandboxd, named in ``$ADX_SANDBOXD_FAULTS`` (crash and failure tests)."""

from __future__ import annotations

import logging
import os
import time

from adx.errors import UnavailableError
from adx.sandboxd._spawn_client import FAULTS_ENV

__all__ = ["fault"]

log = logging.getLogger("adx.sandboxd")


def fault(point: str, delay: float = 0.0) -> None:
    """Test-only fault points named in $ADX_SANDBOXD_FAULTS: ``<point>`` SIGKILLs the daemon right there (no
    cleanup code runs; after ``delay`` seconds, for the other side of a race to get there first); ``<point>:fail``
    makes the step fail as an unavailable native runtime would."""
    faults = os.environ.get(FAULTS_ENV, "").split(",")
    if point in faults:
        time.sleep(delay)
        log.warning("fault injection: SIGKILL at %s", point)
        os.kill(os.getpid(), 9)
    if f"{point}:fail" in faults:
        raise UnavailableError(f"injected fault at {point}")
