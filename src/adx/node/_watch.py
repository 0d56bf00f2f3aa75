"""Waking each Controller's runtime checks from the runtime-control stream (CTL-2, CTL-4).

One task per Environment waits for its own wake-up: an observation of its sandbox changed (a delta on the
node's ONE runtime-control subscription), a Relay stream opened or closed, its Controller changed state, or
its own next deadline (the end of its idle window, a disconnect confirmation) passed. Only the affected
Environment's checks run, and each runs on its own task, so one slow Environment delays no other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from adx.errors import AdxError
from adx.sandboxd import RuntimeControlSubscription

log = logging.getLogger("adx.node.watch")

#: A check with no deadline of its own still runs this often (a missed wake-up costs at most this).
SAFETY_INTERVAL_SECONDS = 5.0


class EnvironmentWatch:
    def __init__(
        self,
        check: Callable[[str], Awaitable[float | None]],
        sandbox_owner: Callable[[str], str | None],
        *,
        safety_interval: float = SAFETY_INTERVAL_SECONDS,
    ) -> None:
        """``check(env_id)`` runs that Environment's checks and returns the seconds until its next deadline
        (None: none); ``sandbox_owner(sandbox_id)`` names the Environment a sandbox belongs to."""
        self._check = check
        self._sandbox_owner = sandbox_owner
        self.safety_interval = safety_interval
        self._wake: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.checks = 0  # how many checks ran (observability, tests)

    def watch(self, env_id: str) -> None:
        if env_id in self._tasks:
            return
        self._wake[env_id] = asyncio.Event()
        self._tasks[env_id] = asyncio.create_task(self._run(env_id), name=f"watch-{env_id}")

    def unwatch(self, env_id: str) -> None:
        """Stop watching (the task ends at its next wake-up, which this triggers)."""
        self._tasks.pop(env_id, None)
        event = self._wake.pop(env_id, None)
        if event is not None:
            event.set()

    def wake(self, env_id: str) -> None:
        event = self._wake.get(env_id)
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        for event in self._wake.values():
            event.set()

    async def follow(self, subscription: RuntimeControlSubscription) -> None:
        """Dispatch the subscription's events: a delta wakes its sandbox's Environment only (CTL-2); a snapshot
        or a broken stream changes every observation, so it wakes all (CTL-3)."""
        async for event in subscription:
            if event.kind == "delta" and event.sandbox_id is not None:
                owner = self._sandbox_owner(event.sandbox_id)
                if owner is not None:
                    self.wake(owner)
            else:
                self.wake_all()

    async def _run(self, env_id: str) -> None:
        wake = self._wake[env_id]
        while self._wake.get(env_id) is wake:
            wake.clear()
            try:
                delay = await self._check(env_id)
            except AdxError as exc:
                log.warning("runtime check failed: %s", exc, extra={"env_id": env_id})
                delay = None
            except Exception:
                log.exception("runtime check crashed", extra={"env_id": env_id})
                delay = None
            self.checks += 1
            timeout = self.safety_interval if delay is None else min(max(delay, 0.0), self.safety_interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._wake.clear()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
