"""Data-plane path parameters the Ingress cannot put in a URL are refused with 422 naming them (issue 17).

schemathesis' stateful phase sent ``DELETE .../commands/%09%C3%AE`` and got 500: the decoded tab went into the
Relay URL, which httpx refuses (InvalidURL). The routes now declare what they accept, so such a request is
refused before anything is forwarded (here: before the Ingress is even needed)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from adx.api._server import create_app
from adx.gateway import ApiConfig

ENV = "env-" + "a" * 26


@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        ("DELETE", f"/v1/environments/{ENV}/commands/%09%C3%AE", "commandId"),
        ("GET", f"/v1/environments/{ENV}/commands/ab%0Acd/output", "commandId"),
        ("GET", f"/v1/environments/{ENV}/ports/8000/a%09b", "path"),
    ],
)
def test_unforwardable_path_parameters_are_invalid_input(method: str, path: str, field: str) -> None:
    client = TestClient(create_app(ApiConfig(e2b=False)), raise_server_exceptions=False)
    answer = client.request(method, path, headers={"Authorization": "Bearer adxk_x"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["details"]["field"] == field


def test_a_missing_query_parameter_named_path_is_named() -> None:
    """The error handler dropped every ``path`` from the location (meant: the ``path`` *kind*), so ``?path=``
    missing said field ''."""
    client = TestClient(create_app(ApiConfig(e2b=False)), raise_server_exceptions=False)
    answer = client.get(f"/v1/environments/{ENV}/files/stat", headers={"Authorization": "Bearer adxk_x"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["details"]["field"] == "path"
