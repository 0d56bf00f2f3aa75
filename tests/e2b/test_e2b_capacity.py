"""The E2B data plane's answer to a capacity refusal (issue 16): a wake of a paused sandbox that no node has room
for is Connect's ``unavailable`` (HTTP 503, retryable), never ``failed_precondition`` (400) nor "not found"."""

from __future__ import annotations

from adx.e2b._connect import HTTP_STATUS, rpc_error
from adx.e2b._envd import _unreachable
from adx.errors import ConflictError, NoCapacityError


def test_a_capacity_refusal_is_unavailable_on_the_envd_plane() -> None:
    refused = NoCapacityError("no node can resume env-1 now (n1: no capacity: cpu)", details={"retry_after_seconds": 5})
    for error in (rpc_error(refused), _unreachable(refused, "env-1")):
        assert error.code == "unavailable" and HTTP_STATUS[error.code] == 503
        assert "no capacity" in error.message
    # Other conflicts keep their answers.
    assert rpc_error(ConflictError("x")).code == "failed_precondition"
    assert "was not found" in _unreachable(ConflictError("x"), "env-1").message
