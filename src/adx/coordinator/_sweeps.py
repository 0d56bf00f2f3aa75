"""The Coordinator's periodic reclamation sweeps (expired snapshots, endpoint tokens of deleted Environments)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from adx.errors import AdxError

log = logging.getLogger("adx.coordinator")


async def sweep_every(
    interval: float, stop: asyncio.Event, sweep: Callable[[], Awaitable[int]], *, what: str, reclaimed: str
) -> None:
    """Run ``sweep`` every ``interval`` seconds until ``stop``. A sweep the store cannot serve is skipped (logged
    as ``what``) and the next one tries again; a sweep that reclaimed anything logs ``reclaimed`` with the count."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if stop.is_set():
            return
        try:
            count = await sweep()
        except AdxError as exc:
            log.warning("%s skipped: %s", what, exc)
            continue
        if count:
            log.info(reclaimed, extra={"count": count})
