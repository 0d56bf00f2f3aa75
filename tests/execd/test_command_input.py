"""Bad command input is a 400 naming its field, never a 500 (found by schemathesis through the Ingress, issue 17)."""

from __future__ import annotations

import pytest
from execd_helpers import ExecdProcess


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"argv": ["echo", "a\x00b"]}, "argv"),
        ({"command": "echo a\x00b"}, "command"),
        ({"argv": ["echo"], "cwd": "/tmp\x00x"}, "cwd"),
    ],
)
def test_a_nul_byte_is_invalid_input(execd: ExecdProcess, body: dict[str, object], field: str) -> None:
    """The kernel takes no NUL inside an argument: subprocess raised ValueError, which execd answered with 500."""
    with execd.client() as client:
        answer = client.post("/v1/commands", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["details"]["field"] == field
