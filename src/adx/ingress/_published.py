"""The last published state of recently changed Environments, and the requests waiting for a change.

The Ingress follows the Coordinator's route stream for its route cache; every commit is published there (the
Lua scripts' ``PUBLISH``). A request that waits for an Environment to leave ``pending``/``starting``
(``GET /v1/environments/{id}?wait=running``, a create with ``wait=running``, E2B's create) is woken by the
event itself, instead of asking the Coordinator on a timer: the poll's detection delay (8-35 ms in
docs/performance.md) and its load go away.

A publication can arrive before its waiter registers (a fast start racing the create's reply), so the last
event of each recently changed Environment is kept (bounded, oldest dropped first) and looked at first.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

#: Recently changed Environments whose last event is kept (a few hundred bytes each): far more than can start
#: within one create's round trip on any cluster one API replica serves.
KEEP_EVENTS = 8192


@dataclass(frozen=True)
class Published:
    """One route publication: an Environment's new state and the revision it was committed at."""

    state: str
    revision: int


#: What a waiter is woken with when the route stream (re)started: events may have been missed, look again.
RESYNC = Published("", -1)


class PublishedStates:
    """Who waits for an Environment's next published state, keyed (tenant, environment) like the route cache
    (a waiter never hears of another tenant's Environment)."""

    def __init__(self, keep: int = KEEP_EVENTS) -> None:
        self._keep = keep
        self._last: OrderedDict[tuple[str, str], Published] = OrderedDict()
        self._waiting: dict[tuple[str, str], set[asyncio.Future[Published]]] = {}

    def published(self, tenant: str, environment_id: str, event: Published) -> None:
        key = (tenant, environment_id)
        last = self._last.get(key)
        if last is not None and last.revision > event.revision:
            return  # an older event arriving late changes nothing
        self._last[key] = event
        self._last.move_to_end(key)
        while len(self._last) > self._keep:
            self._last.popitem(last=False)
        for waiter in self._waiting.get(key, ()):
            if not waiter.done():
                waiter.set_result(event)

    def forget_all(self) -> None:
        """After a resync (events may have been missed): what is kept may be stale, and every waiter is woken
        with RESYNC to look at the Coordinator again."""
        self._last.clear()
        for waiters in self._waiting.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(RESYNC)

    async def changed(
        self, tenant: str, environment_id: str, *, after_revision: int, leaving: frozenset[str], within: float
    ) -> Published | None:
        """The first publication after ``after_revision`` whose state is not in ``leaving`` (one kept from
        before the call counts), RESYNC when the stream restarted meanwhile, or None after ``within`` seconds."""
        key = (tenant, environment_id)
        last = self._last.get(key)
        if last is not None and last.revision > after_revision and last.state not in leaving:
            return last
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        waiters = self._waiting.setdefault(key, set())
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                waiter: asyncio.Future[Published] = loop.create_future()
                waiters.add(waiter)
                try:
                    event = await asyncio.wait_for(waiter, remaining)
                except TimeoutError:
                    return None
                finally:
                    waiters.discard(waiter)
                if event is RESYNC or (event.revision > after_revision and event.state not in leaving):
                    return event
        finally:
            if not waiters:
                self._waiting.pop(key, None)
