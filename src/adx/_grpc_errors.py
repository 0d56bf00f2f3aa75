"""ADX errors across gRPC: one mapping, used by every server and client (translated at the boundary)."""

from __future__ import annotations

import contextlib
from typing import NoReturn

import grpc

from adx.errors import (
    AdxError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
    error_type,
    rebuild_error,
)

CODE_KEY = "adx-error-code"
FIELD_KEY = "adx-error-field"
#: When the caller should ask again (e.g. a resume every node refused, CRD-5): ``details["retry_after_seconds"]``.
RETRY_AFTER_KEY = "adx-error-retry-after"


def status_for(exc: AdxError) -> grpc.StatusCode:
    """The gRPC status an error is answered with: the one its class declares (``adx.errors``)."""
    return grpc.StatusCode[exc.grpc_status]


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


#: The family a status stands for when the server sent it (a call that never reached a handler has no code).
_FAMILY: dict[grpc.StatusCode, type[AdxError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInputError,
    grpc.StatusCode.UNAUTHENTICATED: InvalidInputError,
    grpc.StatusCode.PERMISSION_DENIED: InvalidInputError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ABORTED: ConflictError,
    grpc.StatusCode.FAILED_PRECONDITION: ConflictError,
    grpc.StatusCode.ALREADY_EXISTS: ConflictError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
}


def _translate(exc: grpc.aio.AioRpcError, what: str, trailing: dict[str, object]) -> AdxError:
    message = exc.details() or exc.code().name
    code = exc.code()
    family = _FAMILY.get(code)
    if family is None:
        # DEADLINE_EXCEEDED, UNKNOWN, CANCELLED, INTERNAL: the server may or may not have acted.
        return UncertainOutcomeError(f"{what}: {code.name}: {message}")
    sent = str(trailing.get(CODE_KEY, ""))
    if family is InvalidInputError:
        field = str(trailing.get(FIELD_KEY, "credentials" if code != grpc.StatusCode.INVALID_ARGUMENT else ""))
        return rebuild_error(family, sent, message, {"field": field, "reason": message})
    if family is UnavailableError and error_type(sent) is None:
        # The call never reached a handler (connection refused or reset), or a handler's own kind of
        # unavailability: say what was being called.
        return rebuild_error(family, sent, f"{what}: {message}", {})
    return rebuild_error(family, sent, message, {})
