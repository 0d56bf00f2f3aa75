"""ADX errors across gRPC: one mapping, used by every server and client (translated at the boundary)."""

from __future__ import annotations

import contextlib
from typing import NoReturn

import grpc

from adx.errors import (
    AdxError,
    ConflictError,
    EnvironmentPausedError,
    EnvironmentPausingError,
    InvalidInputError,
    NotFoundError,
    PublicationPendingError,
    SessionExpiredError,
    SessionRejectedError,
    UnavailableError,
    UncertainOutcomeError,
)

CODE_KEY = "adx-error-code"
FIELD_KEY = "adx-error-field"
#: When the caller should ask again (e.g. a resume every node refused, CRD-5): ``details["retry_after_seconds"]``.
RETRY_AFTER_KEY = "adx-error-retry-after"

#: Subclasses rebuilt from the wire code (their family comes from the status).
_BY_CODE: dict[str, type[AdxError]] = {
    cls.code: cls
    for cls in (
        EnvironmentPausedError,
        EnvironmentPausingError,
        PublicationPendingError,
        SessionRejectedError,
        SessionExpiredError,
    )
}

_STATUS: list[tuple[type[AdxError], grpc.StatusCode]] = [
    (InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (ConflictError, grpc.StatusCode.ABORTED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (UncertainOutcomeError, grpc.StatusCode.UNKNOWN),
]


def status_for(exc: AdxError) -> grpc.StatusCode:
    return next((status for family, status in _STATUS if isinstance(exc, family)), grpc.StatusCode.INTERNAL)


async def abort_with(context: grpc.aio.ServicerContext[object, object], exc: AdxError) -> NoReturn:
    metadata: list[tuple[str, str]] = [(CODE_KEY, exc.code)]
    if isinstance(exc, InvalidInputError):
        metadata.append((FIELD_KEY, exc.field))
    if "retry_after_seconds" in exc.details:
        metadata.append((RETRY_AFTER_KEY, str(exc.details["retry_after_seconds"])))
    context.set_trailing_metadata(tuple(metadata))
    await context.abort(status_for(exc), exc.message)
    raise AssertionError("unreachable")  # abort() always raises


def from_rpc_error(exc: grpc.aio.AioRpcError, what: str) -> AdxError:
    """The ADX error a failed call stands for. Transport failures are Unavailable or Uncertain."""
    trailing: dict[str, object] = {item[0]: item[1] for item in exc.trailing_metadata() or ()}  # type: ignore[index]
    error = _translate(exc, what, trailing)
    if isinstance(retry_after := trailing.get(RETRY_AFTER_KEY), str):
        with contextlib.suppress(ValueError):
            error.details["retry_after_seconds"] = float(retry_after)
    return error


def _translate(exc: grpc.aio.AioRpcError, what: str, trailing: dict[str, object]) -> AdxError:
    message = exc.details() or exc.code().name
    code = exc.code()
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidInputError(str(trailing.get(FIELD_KEY, "")), message)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFoundError(message)
    if code in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS):
        sent = _BY_CODE.get(str(trailing.get(CODE_KEY, "")))
        if sent is not None and issubclass(sent, ConflictError):
            return sent(message)
        conflict = ConflictError(message)
        conflict.code = str(trailing.get(CODE_KEY, conflict.code))
        return conflict
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return InvalidInputError("credentials", message)
    if code == grpc.StatusCode.UNAVAILABLE:
        # A handler's answer (it names its code), or the call never reached one (connection refused/reset).
        sent = _BY_CODE.get(str(trailing.get(CODE_KEY, "")))
        if sent is not None and issubclass(sent, UnavailableError):
            return sent(message)
        unavailable = UnavailableError(f"{what}: {message}")
        if isinstance(sent_code := trailing.get(CODE_KEY), str):
            unavailable.code = sent_code
        return unavailable
    # DEADLINE_EXCEEDED, UNKNOWN, CANCELLED, INTERNAL: the server may or may not have acted.
    return UncertainOutcomeError(f"{what}: {code.name}: {message}")
