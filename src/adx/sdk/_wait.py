"""Waiting for ``running``, shared by ``Client`` and ``AsyncClient`` (they differ only in how they sleep and send).

The server waits: a create or a GET with ``?wait=running&waitSeconds=S`` answers the moment the commit is
published (no poll delay, no GET per 15 ms while the sandbox starts), and the wait primes the server's route
cache for the first command. A long wait is asked for in pieces of at most LONG_POLL_SECONDS (one HTTP request
is not held open for minutes). A server that answers at once with a state still on the way to running (one
that predates ``wait``) is polled as before: every 15 ms for the first second, then backing off.
"""

from __future__ import annotations

import time

from adx.errors import ConflictError
from adx.model import EnvironmentState
from adx.sdk._errors import WaitTimeoutError
from adx.sdk._models import EnvironmentFields

#: The longest single wait asked of the server (its own cap is 300 s).
LONG_POLL_SECONDS = 60.0
#: The states a server's wait goes on through; any other is its final answer.
ON_THE_WAY = frozenset({EnvironmentState.PENDING, EnvironmentState.STARTING, EnvironmentState.RESUMING})
# Polling a server without ``wait``: a start takes ~0.1-0.3 s, so every 15 ms for the first second (each poll is
# one ~1 ms GET), then back off so a long wait costs little.
POLL_FIRST = 0.015
POLL_FAST_FOR = 1.0
POLL_GROWTH = 1.3
POLL_MAX = 0.5
FAILED_STATES = frozenset({EnvironmentState.FAILED, EnvironmentState.DELETING, EnvironmentState.DELETED})


class RunningWait:
    """One wait for ``running`` within ``timeout`` seconds: what to ask the server next, and how long to
    sleep before asking (0 while the server waits itself)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self._pause = 0.0
        self._poll = POLL_FIRST

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def params(self) -> dict[str, str]:
        """The query of the next wait: the rest of the time, in pieces of LONG_POLL_SECONDS at most."""
        seconds = min(max(self.remaining(), 0.001), LONG_POLL_SECONDS)
        return {"wait": "running", "waitSeconds": f"{seconds:.3f}"}

    def call_timeout(self, client_timeout: float) -> float:
        """The HTTP timeout of a call that waits: the client's own on top of the wait it asks for."""
        return client_timeout + min(max(self.remaining(), 0.0), LONG_POLL_SECONDS)

    def pause(self, environment: EnvironmentFields) -> float:
        """Seconds to sleep before asking again; raises WaitTimeoutError when the time is over."""
        if self.remaining() - self._pause <= 0:
            raise WaitTimeoutError(
                f"environment {environment.id} is still {environment.state.value} after {self.timeout:g}s "
                f"(node {environment.node}); it exists: wait again with wait_until_running() or delete it",
                environment,
            )
        return self._pause

    def answered(self, environment: EnvironmentFields) -> None:
        """An answer that is still on the way to running came from a server that does not wait (or its wait
        ended first, after a create): the next ask is paused, as the poll before ``wait`` existed."""
        if environment.state in ON_THE_WAY:
            if self._pause and time.monotonic() - self.started > POLL_FAST_FOR:
                self._poll = min(self._poll * POLL_GROWTH, POLL_MAX)
            self._pause = self._poll


def check_waitable(env: EnvironmentFields) -> None:
    if env.state in FAILED_STATES:
        error = ConflictError(
            f"environment {env.id} is {env.state.value}, it will not become running"
            + (f": {env.last_error}" if env.last_error else ""),
            details={"id": env.id, "state": env.state.value},
        )
        error.code = "environment_failed"
        raise error
