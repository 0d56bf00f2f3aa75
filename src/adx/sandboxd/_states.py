"""The sandbox state machine: every state and every allowed transition, in one place.

Authority per state (SBX-2): ``creating`` and ``stopping`` are persisted intents (queries never override
``stopping``); ``running``/``paused``/``terminated`` are native observations; ``failed`` is a native
``Missing`` or a create whose cleanup is uncertain (SBX-13); ``deleted`` exists only as a tombstone.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from adx.errors import ConflictError

__all__ = ["ALLOWED", "TERMINAL_FOR_WAIT", "State", "check_transition"]

log = logging.getLogger("adx.sandboxd.state")


class State(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSED = "paused"
    TERMINATED = "terminated"
    FAILED = "failed"
    STOPPING = "stopping"
    DELETED = "deleted"


ALLOWED: dict[State, frozenset[State]] = {
    # A create ends running, failed (cleanup uncertain), or deleted (failure cleaned up, SBX-13); it may also
    # be deleted while starting (the supervisor sees the intent under its lock and does not start).
    State.CREATING: frozenset({State.RUNNING, State.TERMINATED, State.FAILED, State.STOPPING, State.DELETED}),
    State.RUNNING: frozenset({State.PAUSED, State.TERMINATED, State.FAILED, State.STOPPING}),
    State.PAUSED: frozenset({State.RUNNING, State.TERMINATED, State.FAILED, State.STOPPING}),
    # Terminated/failed workloads are never restarted (SBX-5, SBX-11): the only way on is delete.
    State.TERMINATED: frozenset({State.FAILED, State.STOPPING}),
    State.FAILED: frozenset({State.STOPPING}),
    # The persisted delete intent is retried until it completes; nothing else may replace it (SBX-2).
    State.STOPPING: frozenset({State.DELETED}),
    State.DELETED: frozenset(),
}

#: States in which a workload will never run again (Wait returns on these).
TERMINAL_FOR_WAIT = frozenset({State.TERMINATED, State.FAILED, State.STOPPING, State.DELETED})


def check_transition(sandbox_id: str, generation: int, old: State, new: State, reason: str) -> None:
    """Raise ConflictError unless ``old -> new`` is allowed; log every real transition."""
    if old == new:
        return
    if new not in ALLOWED[old]:
        raise ConflictError(
            f"sandbox {sandbox_id}: transition {old} -> {new} is not allowed",
            details={"sandbox_id": sandbox_id, "from": str(old), "to": str(new)},
        )
    log.info(
        "sandbox %s: %s -> %s (%s)",
        sandbox_id,
        old,
        new,
        reason,
        extra={"sandbox_id": sandbox_id, "generation": generation, "from": str(old), "to": str(new)},
    )
