"""Waiting for an Environment to be running (``?wait=running``, E2B's create), woken by the route stream.

Every commit is published on the Coordinator's route stream, which the Ingress follows for its route cache
(CRD-1). A waiting request sleeps until the publication that moves the Environment out of its way to running,
then reads the route once (the authoritative record, the owner's Relay and gRPC API) and primes the route cache
with it, so the first command after a create with ``wait=running`` is not resolved at the Coordinator again.
Without the stream (no Ingress here, or it is reconnecting) the Coordinator is asked on a short backoff, as
the SDK's own poll did.
"""

from __future__ import annotations

import asyncio

from adx.errors import WaitTimeoutError
from adx.gateway._context import Plane
from adx.model import EnvironmentRecord, EnvironmentState

#: The states on the way to running: a wait goes on through these; any other state is the answer at once.
ON_THE_WAY = frozenset({EnvironmentState.PENDING, EnvironmentState.STARTING, EnvironmentState.RESUMING})
_ON_THE_WAY_WIRE = frozenset(s.value for s in ON_THE_WAY)
#: The longest wait a request may ask for (one HTTP request held open; the SDK asks again for longer ones).
MAX_WAIT_SECONDS = 300.0
#: While woken by the stream, the Coordinator is still asked this often: a publication lost between the
#: Redis pub/sub and this replica (the stream's resync reconciles cached routes, not waiters) costs at most this.
CHECK_EVERY_SECONDS = 1.0
_POLL_FIRST, _POLL_MAX = 0.02, 0.25


async def wait_running(p: Plane, tenant: str, record: EnvironmentRecord, seconds: float) -> EnvironmentRecord:
    """The Environment's record once it is no longer on its way to running (running, or failed, deleted, ...),
    or as it is after ``seconds`` (its state still in ON_THE_WAY: the caller decides what a timeout means)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    delay = _POLL_FIRST
    while record.state in ON_THE_WAY:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return record
        routes = p.routes
        if routes is not None and routes.following:
            await routes.state_published(
                tenant,
                record.id,
                after_revision=record.revision,
                leaving=_ON_THE_WAY_WIRE,
                within=min(remaining, CHECK_EVERY_SECONDS),
            )
        else:
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 1.5, _POLL_MAX)
        route = await p.coordinator.resolve_route(tenant, record.id)
        if routes is not None:
            routes.remember(tenant, route)  # running: the first command finds its Relay in the cache
        record = route.record
    return record


def wait_timeout(record: EnvironmentRecord, seconds: float) -> WaitTimeoutError:
    """The answer to a wait that ended first: 503 ``wait_timeout``, saying where the Environment is now."""
    return WaitTimeoutError(
        f"environment {record.id} is still {record.state.value} after waiting {seconds:g}s for running; "
        "it goes on: ask again (or delete it)",
        details={"id": record.id, "state": record.state.value, "waitedSeconds": seconds},
    )
