"""The one exception hierarchy of ADX.

Every error ADX raises on purpose derives from :class:`AdxError`. Families are split by *kind of failure*,
because that is what a caller branches on: bad input is fixed by the caller, *not found* and *conflict* are
answers, *unavailable* may succeed on retry, and an *uncertain outcome* means the operation may or may not
have happened and must be reconciled before it is retried blindly. Lower-layer exceptions (redis-py,
psycopg, grpc, OS errors) are translated into these families at the boundary that catches them.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AdxError",
    "AuthenticationError",
    "ConflictError",
    "EnvironmentPausedError",
    "EnvironmentPausingError",
    "ForbiddenError",
    "ImageBuildError",
    "InvalidInputError",
    "NoCapacityError",
    "NotFoundError",
    "PublicationPendingError",
    "SessionExpiredError",
    "SessionRejectedError",
    "UnavailableError",
    "UncertainOutcomeError",
    "VersionMismatchError",
    "WaitTimeoutError",
    "error_for_http",
    "error_type",
    "rebuild_error",
]

#: What an error carries beside its message: a JSON object (HTTP ``error.details``, gRPC trailing metadata)
#: whose keys the error documents (``field`` and ``reason``, ``state``, ``retry_after_seconds``, ...).
ErrorDetails = dict[str, Any]

#: Every error type that declares its own ``code``, by that code: a client rebuilds the exact subclass a server
#: raised from the wire code alone (HTTP body, gRPC trailing metadata).
_BY_CODE: dict[str, type[AdxError]] = {}


class AdxError(Exception):
    """Root of every error ADX raises on purpose.

    Each class declares, once, how it crosses every boundary, and the boundaries only look it up:

    - ``code``: the stable machine-readable identifier (HTTP error bodies, gRPC trailing metadata);
    - ``http_status``: the status of an HTTP answer;
    - ``grpc_status``: the name of the ``grpc.StatusCode`` of a gRPC answer (a name: this module does no I/O);
    - ``exit_code``: the CLI's exit status (docs/cli.md).

    A subclass inherits its family's statuses and overrides only what differs. ``details`` carries structured
    context such as the offending field.
    """

    code: str = "adx_error"
    http_status: ClassVar[int] = 500
    grpc_status: ClassVar[str] = "INTERNAL"
    exit_code: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code")
        if isinstance(code, str):
            known = _BY_CODE.setdefault(code, cls)
            if known is not cls and known.__qualname__ != cls.__qualname__:  # a re-import of a module is fine
                raise TypeError(f"error code {code!r} is declared by {known.__qualname__} and {cls.__qualname__}")

    def __init__(self, message: str, *, details: ErrorDetails | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: ErrorDetails = dict(details or {})

    def __str__(self) -> str:
        return self.message


class InvalidInputError(AdxError):
    """The request or configuration is invalid; retrying it unchanged will fail again.

    ``field`` is the dotted path of the offending value (``resources.cpuMillis``, ``redis.port``).
    """

    code = "invalid_input"
    http_status = 422
    grpc_status = "INVALID_ARGUMENT"
    exit_code = 2

    def __init__(self, field: str, reason: str, *, details: ErrorDetails | None = None) -> None:
        self.field = field
        self.reason = reason
        merged = {"field": field, "reason": reason, **(details or {})}
        super().__init__(f"{field}: {reason}" if field else reason, details=merged)


class NotFoundError(AdxError):
    """The named object does not exist (or is not visible to the caller)."""

    code = "not_found"
    http_status = 404
    grpc_status = "NOT_FOUND"
    exit_code = 3


class ConflictError(AdxError):
    """The object exists but is in a state or version that does not allow the operation."""

    code = "conflict"
    http_status = 409
    grpc_status = "ABORTED"
    exit_code = 4


class UnavailableError(AdxError):
    """A dependency (server, daemon, binary, port) is not available; the operation did not happen."""

    code = "unavailable"
    http_status = 503
    grpc_status = "UNAVAILABLE"
    exit_code = 5


class UncertainOutcomeError(AdxError):
    """The operation may or may not have taken effect (lost reply, timeout after send, crash mid-write).

    Callers must reconcile with the authority before acting on either assumption.
    """

    code = "uncertain_outcome"
    http_status = 504
    grpc_status = "UNKNOWN"
    exit_code = 6


class AuthenticationError(InvalidInputError):
    """A missing, malformed, unknown or revoked API key: a kind of invalid input, told apart because the fix is
    another key, not another request (HTTP 401)."""

    code = "unauthenticated"
    http_status = 401
    grpc_status = "UNAUTHENTICATED"
    exit_code = 7


class ForbiddenError(AuthenticationError):
    """A valid credential that may not do this: e.g. a tenant API key on an admin route (HTTP 403). The fix is the
    right credential, which the message names."""

    code = "forbidden"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"


class NoCapacityError(ConflictError):
    """No node can take the Environment now (capacity, an expired sample, closed admission). A conflict inside
    the cluster, but to an API caller "try again later": HTTP 503 with ``details["retry_after_seconds"]``."""

    code = "no_capacity"
    http_status = 503


class ImageBuildError(ConflictError):
    """An image build step failed (its command exited non-zero or did not finish); ``details["line"]`` names the
    Dockerfile line. The image keeps its previous manifest; the layers of the steps before stay cached."""

    code = "image_build_failed"
    http_status = 422
    grpc_status = "FAILED_PRECONDITION"


class EnvironmentPausedError(ConflictError):
    """The Environment is pausing, paused or resuming: business traffic wakes it (ENV-4) through the
    Coordinator's resume entry; the Relay answers with this code and the Ingress wakes it and asks again."""

    code = "environment_paused"


class EnvironmentPausingError(UnavailableError):
    """A pause's capture has started: the request is served after the resume (IDLE-6)."""

    code = "environment_pausing"


class WaitTimeoutError(UnavailableError):
    """A wait for a state (``?wait=running``) ended before the state was reached. What was waited for exists and
    goes on (``details["state"]``: where it is now): ask again, or delete it."""

    code = "wait_timeout"


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


def error_type(code: str) -> type[AdxError] | None:
    """The error class that declares ``code``, if any (only classes of this module are known to every client)."""
    return _BY_CODE.get(code)


def rebuild_error(family: type[AdxError], code: str, message: str, details: ErrorDetails) -> AdxError:
    """The error a server answered, on the client side: the exact subclass when the wire code names one of the
    ``family`` the status stands for, else ``family`` itself keeping the server's code. Constructors of
    subclasses take varied arguments; the wire carries only code, message and details, so they are bypassed."""
    cls = _BY_CODE.get(code)
    if cls is None or not issubclass(cls, family):
        cls = family
    exc = cls.__new__(cls)
    AdxError.__init__(exc, message, details=details)
    if isinstance(exc, InvalidInputError):
        exc.field = str(details.get("field", ""))
        exc.reason = str(details.get("reason") or message)
    if code and code != cls.code:
        exc.code = code
    return exc


def error_for_http(status: int, code: str, message: str, details: ErrorDetails) -> AdxError:
    """The error an ADX HTTP answer carries: the exact class its code names when the status agrees with it, else
    the family whose status it is (keeping the server's code), else the root."""
    known = _BY_CODE.get(code)
    if known is not None and known.http_status == status:
        return rebuild_error(known, code, message, details)
    families = (InvalidInputError, NotFoundError, ConflictError, UnavailableError, UncertainOutcomeError)
    family = next((f for f in families if f.http_status == status), AdxError)
    if status == 400:  # a plain Bad Request is invalid input too
        family = InvalidInputError
    return rebuild_error(family, code, message, details)
