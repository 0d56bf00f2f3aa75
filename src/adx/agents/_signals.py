"""How an agent role process (worker, maintenance) is asked to stop: SIGTERM or SIGINT, on the running loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

__all__ = ["STOP_SIGNALS", "stop_on_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Call ``stop`` (on the loop, never in a signal frame) for each stop signal while inside; leaving removes the
    handlers, so a later signal gets Python's default again."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
