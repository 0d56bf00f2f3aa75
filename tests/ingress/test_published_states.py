"""The Ingress's record of published states and its waiters (``adx.ingress._published``), on its own."""

from __future__ import annotations

import asyncio

from adx.ingress._published import RESYNC, Published, PublishedStates

WAITING = frozenset({"pending", "starting"})


async def test_a_waiter_wakes_on_the_first_state_that_leaves_the_way_not_before() -> None:
    states = PublishedStates()
    waiting = asyncio.create_task(states.changed("t", "e", after_revision=1, leaving=WAITING, within=5))
    await asyncio.sleep(0)
    states.published("t", "e", Published("starting", 2))  # still on the way: it sleeps on
    states.published("u", "e", Published("running", 3))  # another tenant's: never heard
    await asyncio.sleep(0.05)
    assert not waiting.done()
    states.published("t", "e", Published("running", 3))
    assert await waiting == Published("running", 3)


async def test_a_publication_before_the_wait_counts_and_an_older_one_does_not() -> None:
    states = PublishedStates()
    states.published("t", "e", Published("running", 5))
    states.published("t", "e", Published("starting", 4))  # late and older: ignored
    assert await states.changed("t", "e", after_revision=3, leaving=WAITING, within=5) == Published("running", 5)
    assert await states.changed("t", "e", after_revision=5, leaving=WAITING, within=0.05) is None


async def test_a_resync_wakes_every_waiter_and_forgets_what_was_kept() -> None:
    states = PublishedStates()
    states.published("t", "old", Published("running", 9))
    waiters = [
        asyncio.create_task(states.changed("t", env, after_revision=1, leaving=WAITING, within=5)) for env in "ab"
    ]
    await asyncio.sleep(0)
    states.forget_all()
    assert await asyncio.gather(*waiters) == [RESYNC, RESYNC]
    assert await states.changed("t", "old", after_revision=1, leaving=WAITING, within=0.01) is None


async def test_only_the_most_recent_environments_are_kept() -> None:
    states = PublishedStates(keep=2)
    for i, env in enumerate("abc"):
        states.published("t", env, Published("running", i + 1))
    assert await states.changed("t", "a", after_revision=0, leaving=WAITING, within=0.01) is None
    assert await states.changed("t", "c", after_revision=0, leaving=WAITING, within=0.01) == Published("running", 3)
