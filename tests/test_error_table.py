"""One error table: each class in ``adx.errors`` declares its wire code, HTTP status, gRPC status and exit code
once; the HTTP, gRPC and CLI boundaries look them up, and clients rebuild the exact subclass from the code."""

from __future__ import annotations

import json

import grpc
import pytest

import adx.errors
from adx._grpc_errors import CODE_KEY, FIELD_KEY, from_rpc_error, status_for
from adx.cli._app import exit_status
from adx.errors import (
    AdxError,
    AuthenticationError,
    ConflictError,
    EnvironmentPausedError,
    InvalidInputError,
    NoCapacityError,
    PublicationPendingError,
    SessionExpiredError,
    UnavailableError,
    error_type,
)
from adx.gateway import Unauthenticated, error_response
from adx.sandboxd._client import _to_error as sandboxd_error
from adx.sandboxd._errors import PermissionDeniedError
from adx.sandboxd._http import _error_body as sandboxd_error_body
from adx.sdk._errors import error_from_response

TABLE = [
    v
    for v in vars(adx.errors).values()
    if isinstance(v, type) and issubclass(v, AdxError) and v is not AdxError and "code" in v.__dict__
]


def _sample(cls: type[AdxError]) -> AdxError:
    if issubclass(cls, InvalidInputError):
        return cls("resources.cpuMillis", "must be positive")
    return cls(f"a {cls.__name__}", details={"retry_after_seconds": 3})


def test_every_code_names_one_class_and_every_status_is_real() -> None:
    assert len({cls.code for cls in TABLE}) == len(TABLE)
    for cls in TABLE:
        assert error_type(cls.code) is cls
        assert grpc.StatusCode[cls.grpc_status] is not None
        assert 400 <= cls.http_status <= 599 and 1 <= cls.exit_code <= 7


def test_the_statuses_users_rely_on() -> None:
    assert (NoCapacityError.http_status, NoCapacityError.exit_code) == (503, ConflictError.exit_code)
    assert issubclass(NoCapacityError, ConflictError)  # a conflict inside the cluster, "later" to an API caller
    assert (AuthenticationError.http_status, AuthenticationError.exit_code) == (401, 7)
    assert Unauthenticated("no key").http_status == 401 and "code" not in Unauthenticated.__dict__
    assert (SessionExpiredError.grpc_status, EnvironmentPausedError.http_status) == ("ABORTED", 409)
    assert exit_status(InvalidInputError("x", "y")) == 2 and exit_status(AdxError("other")) == 1


def test_a_second_class_cannot_take_a_declared_code() -> None:
    with pytest.raises(TypeError, match="no_capacity"):
        type("Impostor", (ConflictError,), {"code": "no_capacity"})


@pytest.mark.parametrize("cls", TABLE, ids=lambda c: c.__name__)
def test_http_answer_rebuilds_the_exact_class(cls: type[AdxError]) -> None:
    sent = _sample(cls)
    response = error_response(sent)
    assert response.status_code == cls.http_status
    got = error_from_response("POST", response.status_code, bytes(response.body), "create environment")
    if cls.http_status in (401, 403):  # the SDK words a refused key itself, naming where to get another
        assert type(got) is AuthenticationError and got.field == "api_key"
        return
    assert type(got) is cls and got.code == cls.code
    if isinstance(sent, InvalidInputError):
        assert isinstance(got, InvalidInputError) and (got.field, got.reason) == (sent.field, sent.reason)
    body = json.loads(bytes(response.body))
    assert body["error"]["code"] == cls.code


@pytest.mark.parametrize("cls", TABLE, ids=lambda c: c.__name__)
def test_grpc_answer_rebuilds_the_exact_class(cls: type[AdxError]) -> None:
    sent = _sample(cls)
    trailing = [(CODE_KEY, sent.code)]
    if isinstance(sent, InvalidInputError):
        trailing.append((FIELD_KEY, sent.field))
    rpc_error = grpc.aio.AioRpcError(
        status_for(sent), grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details=sent.message
    )
    got = from_rpc_error(rpc_error, "CreateEnvironment")
    if cls.grpc_status == "UNKNOWN":  # an uncertain outcome stays uncertain whatever the server said
        assert isinstance(got, adx.errors.UncertainOutcomeError)
        return
    assert type(got) is cls and got.code == cls.code
    if isinstance(sent, InvalidInputError):
        assert isinstance(got, InvalidInputError) and got.field == sent.field


def test_unknown_codes_keep_the_family_and_the_code() -> None:
    response = error_response(UnavailableError("relay down"))
    body = json.loads(bytes(response.body))
    body["error"]["code"] = "relay_unavailable_v2"
    got = error_from_response("GET", 503, json.dumps(body).encode(), "get environment")
    assert type(got) is UnavailableError and got.code == "relay_unavailable_v2"
    assert isinstance(error_from_response("POST", 503, json.dumps(body).encode(), "x"), UnavailableError)
    pending = error_from_response("POST", 503, bytes(error_response(PublicationPendingError("later")).body), "x")
    assert type(pending) is PublicationPendingError


@pytest.mark.parametrize("cls", [*TABLE, PermissionDeniedError], ids=lambda c: c.__name__)
def test_sandboxd_answer_rebuilds_the_exact_class(cls: type[AdxError]) -> None:
    """sandboxd's HTTP answers use the same table; its client rebuilds the exact class from the code."""
    sent = _sample(cls)
    status, reason, body = sandboxd_error_body(sent)
    assert status == cls.http_status and reason
    got = sandboxd_error(status, body)
    assert type(got) is cls and got.message == sent.message
