"""Agent-runtime errors: each one a member of an :mod:`adx.errors` family, so callers branch on the family."""

from __future__ import annotations

from adx.errors import ConflictError, InvalidInputError, UnavailableError

__all__ = ["EvidenceError", "SchemaValidationError", "StaleFenceError", "error_text"]


class SchemaValidationError(InvalidInputError):
    """A document does not match its frozen schema; ``field`` is the JSON path of the first error."""

    code = "schema_validation_failed"

    def __init__(self, schema_id: str, field: str, reason: str) -> None:
        self.schema_id = schema_id
        super().__init__(field, reason, details={"schema_id": schema_id})


class StaleFenceError(ConflictError):
    """The caller no longer owns the run (higher fence, other revision, or another terminal change).

    Lifecycle code treats this as *fail closed*: it never retries the write and never finalises anything.
    """

    code = "stale_fence"


class EvidenceError(UnavailableError):
    """Trusted lifecycle evidence could not be recovered or did not match the handoff.

    The run is never partially finalised: the exact fence is released (or left to expire).
    """

    code = "evidence_unavailable"


def error_text(exc: BaseException) -> str:
    """How a failure is recorded (attempt errors, release reasons): its type and message, bounded at 1 KiB like
    every reason the journal keeps."""
    return f"{type(exc).__name__}: {exc}"[:1024]
