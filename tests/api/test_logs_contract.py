"""The logs route's contract without a cluster: typed in OpenAPI (query parameters with their bounds, the
EnvironmentLogs answer), and the SDK's and CLI's argument checks name the field before any request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from adx.cli._logs_cmd import parse_since
from adx.errors import InvalidInputError
from adx.sdk._logs import logs_params


def test_openapi_types_the_logs_route(tmp_path: Path) -> None:
    from adx.api import ApiConfig, create_app

    schema = create_app(ApiConfig(certs_dir=tmp_path)).openapi()
    op = schema["paths"]["/v1/environments/{environment_id}/logs"]["get"]
    answer = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer["$ref"].endswith("/EnvironmentLogs")
    params = {p["name"]: p["schema"] for p in op["parameters"] if p["in"] == "query"}
    assert set(params) == {"tail", "since", "cursor", "limit", "waitSeconds"}
    assert params["limit"]["maximum"] == 10_000 and params["waitSeconds"]["maximum"] == 60
    entry = schema["components"]["schemas"]["LogEntry"]["properties"]
    assert set(entry) == {"time", "stream", "text", "partial", "executionId"}
    assert entry["stream"]["enum"] == ["stdout", "stderr"]


def test_sdk_and_cli_arguments_are_checked_and_named() -> None:
    assert logs_params(tail=5) == {"limit": "1000", "tail": "5"}
    assert logs_params(tail=5, cursor="c:1", wait_seconds=25) == {"limit": "1000", "cursor": "c:1", "waitSeconds": "25"}
    naive = logs_params(since=datetime(2026, 12, 2, 13, 0))
    assert naive["since"] == "2026-12-02T13:00:00+00:00", "a time without a zone is UTC"
    for kwargs, field in (({"tail": -1}, "tail"), ({"limit": 0}, "limit"), ({"wait_seconds": 61}, "wait_seconds")):
        with pytest.raises(InvalidInputError) as err:
            logs_params(**kwargs)  # type: ignore[arg-type]
        assert err.value.details.get("field", field) == field and field in str(err.value)
    now = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)
    assert parse_since("1h30m", now) == now - timedelta(hours=1, minutes=30)
    assert parse_since("45s", now) == now - timedelta(seconds=45)
    assert parse_since("2026-12-02T12:00:00Z") == datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    with pytest.raises(InvalidInputError, match="--since"):
        parse_since("yesterday")
