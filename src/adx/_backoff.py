"""Capped exponential backoff: the one helper behind every retry loop of ADX (Controllers, recovery, the
Coordinator's waits, execd's control connection, the SDK, the agent driver, restart policies).

Standard library only and allocation-free after construction: execd (inside every sandbox) imports it, and
its idle memory is paid per sandbox (measured: execd's idle PSS is unchanged by it; see the commit message).
"""

from __future__ import annotations

__all__ = ["Backoff", "capped_exponential"]


def capped_exponential(first: float, cap: float, attempt: int) -> float:
    """The delay before retry ``attempt`` (0 = the first retry): ``first * 2**attempt``, at most ``cap``."""
    if attempt >= 64:  # 2**64 * first overflows any useful cap: it is the cap
        return float(cap)
    return float(min(first * 2.0**attempt, cap))


class Backoff:
    """Delays of one retry loop: ``first``, then doubling up to ``cap``; :meth:`reset` after a success."""

    __slots__ = ("_next", "cap", "first")

    def __init__(self, first: float, cap: float) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"backoff needs 0 < first <= cap, got first={first}, cap={cap}")
        self.first = first
        self.cap = cap
        self._next = first

    def peek(self) -> float:
        """The delay :meth:`next` would return, without consuming it."""
        return self._next

    def next(self) -> float:
        delay = self._next
        self._next = min(delay * 2.0, self.cap)
        return delay

    def reset(self) -> None:
        self._next = self.first

    async def sleep(self) -> None:
        # Imported here, not at the top: adx.model (restart policies) imports this module, and a CLI command
        # that only reads models should not load asyncio; inside a coroutine it is already loaded.
        import asyncio

        await asyncio.sleep(self.next())
