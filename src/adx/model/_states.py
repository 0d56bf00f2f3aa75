"""Environment states and the transitions between them: the one table every component checks against."""

from __future__ import annotations

from enum import StrEnum

from adx.errors import ConflictError


class EnvironmentState(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    DELETING = "deleting"
    DELETED = "deleted"
    FAILED = "failed"


S = EnvironmentState

ALLOWED_TRANSITIONS: dict[EnvironmentState, frozenset[EnvironmentState]] = {
    S.PENDING: frozenset({S.STARTING, S.FAILED, S.DELETING}),
    S.STARTING: frozenset({S.RUNNING, S.FAILED, S.DELETING}),
    # RUNNING -> STARTING is a restart under the restart policy (new execution, same generation).
    S.RUNNING: frozenset({S.PAUSING, S.FAILED, S.STARTING, S.DELETING}),
    # PAUSING -> RUNNING: the pause was cancelled by demand before capture, or its capture failed.
    S.PAUSING: frozenset({S.PAUSED, S.RUNNING, S.FAILED, S.DELETING}),
    S.PAUSED: frozenset({S.RESUMING, S.DELETING}),
    # RESUMING -> PAUSED: every node refused or the resume failed before a new execution existed.
    S.RESUMING: frozenset({S.RUNNING, S.PAUSED, S.FAILED, S.DELETING}),
    S.DELETING: frozenset({S.DELETED}),
    S.DELETED: frozenset(),
    # FAILED -> STARTING: a pending restart (restart policy) after cleanup was confirmed (RST-5).
    S.FAILED: frozenset({S.STARTING, S.DELETING}),
}

TERMINAL_STATES = frozenset({S.DELETED})

#: How a node's failed resume (RESUMING -> PAUSED, no new execution) begins its record's ``last_error``: the
#: Coordinator answers the waiting demand with it instead of handing the same resume over again (CRD-5).
RESUME_FAILED = "resume failed"

#: An Environment that sleeps: no execution serves it; business traffic wakes it (ENV-4), health and usage
#: requests never do.
DORMANT_STATES = frozenset({S.PAUSING, S.PAUSED, S.RESUMING})


def can_transition(current: EnvironmentState, target: EnvironmentState) -> bool:
    return target in ALLOWED_TRANSITIONS[current]


def check_transition(current: EnvironmentState, target: EnvironmentState, *, env_id: str = "") -> None:
    """Raise ConflictError if ``current -> target`` is not an allowed transition."""
    if not can_transition(current, target):
        allowed = ", ".join(sorted(ALLOWED_TRANSITIONS[current])) or "none"
        who = f"environment {env_id} " if env_id else ""
        raise ConflictError(
            f"{who}cannot go from {current.value} to {target.value} (allowed from {current.value}: {allowed})",
            details={"from": current.value, "to": target.value},
        )
