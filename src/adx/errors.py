"""The one exception hierarchy of ADX.

Every error ADX raises on purpose derives from :class:`AdxError`. Families are split by *kind of failure*,
because that is what a caller branches on: bad input is fixed by the caller, *not found* and *conflict* are
answers, *unavailable* may succeed on retry, and an *uncertain outcome* means the operation may or may not
have happened and must be reconciled before it is retried blindly. Lower-layer exceptions (redis-py,
psycopg, grpc, OS errors) are translated into these families at the boundary that catches them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AdxError",
    "ConflictError",
    "EnvironmentPausedError",
    "EnvironmentPausingError",
    "InvalidInputError",
    "NotFoundError",
    "PublicationPendingError",
    "SessionExpiredError",
    "SessionRejectedError",
    "UnavailableError",
    "UncertainOutcomeError",
    "VersionMismatchError",
]


class AdxError(Exception):
    """Root of every error ADX raises on purpose.

    ``code`` is a stable machine-readable identifier (used in HTTP error bodies); ``details`` carries
    structured context such as the offending field.
    """

    code: str = "adx_error"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def __str__(self) -> str:
        return self.message


class InvalidInputError(AdxError):
    """The request or configuration is invalid; retrying it unchanged will fail again.

    ``field`` is the dotted path of the offending value (``resources.cpuMillis``, ``redis.port``).
    """

    code = "invalid_input"

    def __init__(self, field: str, reason: str, *, details: dict[str, Any] | None = None) -> None:
        self.field = field
        self.reason = reason
        merged = {"field": field, "reason": reason, **(details or {})}
        super().__init__(f"{field}: {reason}" if field else reason, details=merged)


class NotFoundError(AdxError):
    """The named object does not exist (or is not visible to the caller)."""

    code = "not_found"


class ConflictError(AdxError):
    """The object exists but is in a state or version that does not allow the operation."""

    code = "conflict"


class UnavailableError(AdxError):
    """A dependency (server, daemon, binary, port) is not available; the operation did not happen."""

    code = "unavailable"


class UncertainOutcomeError(AdxError):
    """The operation may or may not have taken effect (lost reply, timeout after send, crash mid-write).

    Callers must reconcile with the authority before acting on either assumption.
    """

    code = "uncertain_outcome"


class EnvironmentPausedError(ConflictError):
    """The Environment is pausing, paused or resuming: business traffic wakes it (ENV-4) through the
    Coordinator's resume entry; the Relay answers with this code and the Ingress wakes it and asks again."""

    code = "environment_paused"


class EnvironmentPausingError(UnavailableError):
    """A pause's capture has started: the request is served after the resume (IDLE-6)."""

    code = "environment_pausing"


class PublicationPendingError(UnavailableError):
    """The node finished the operation, but the cluster has not stored its result yet (ENV-6, JRN-4): it is
    kept on the node (``details["journaled"]``: in its degradation journal) and published once the Coordinator
    can store it. Asking again later shows the published result."""

    code = "publication_pending"


class SessionRejectedError(ConflictError):
    """A node's session is not the registered one (another process of that node registered): the node must
    register again, behind its barrier (NOD-6). Nothing the call asked for was done."""

    code = "session_rejected"


class VersionMismatchError(ConflictError):
    """Two parts that must run the same version do not (CTL-8: the node, sandboxd and execd speak one
    runtime-control protocol). Nothing degrades silently: upgrade the parts together."""

    code = "version_mismatch"


class SessionExpiredError(SessionRejectedError):
    """A node's session expired (no heartbeat within its TTL): the node must register again (NOD-6)."""

    code = "session_expired"
