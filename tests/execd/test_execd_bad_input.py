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


@pytest.mark.parametrize("value", [True, None, 12, "QUJD!", "QUJ"])
def test_stdin_base64_must_be_base64_text(execd: ExecdProcess, value: object) -> None:
    """A non-string was turned into its repr (true -> "True", valid base64) and invalid characters were skipped."""
    with execd.client() as client:
        answer = client.post("/v1/commands", json={"argv": ["cat"], "stdinBase64": value})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["details"]["field"] == "stdinBase64"


def test_a_path_too_long_is_invalid_input(execd: ExecdProcess) -> None:
    """ENAMETOOLONG was an io_error 500; it is the request's path that is wrong."""
    with execd.client() as client:
        answer = client.get("/v1/files/stat", params={"path": "/" + "a" * 300})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["details"]["field"] == "path"


def test_watcher_entries_must_be_a_boolean(execd: ExecdProcess) -> None:
    """``entries`` (envd's include_entry) is a flag: another value is refused naming it, not read as truthy."""
    with execd.client() as client:
        answer = client.post("/v1/watchers", json={"path": "/tmp", "entries": "yes"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["details"]["field"] == "entries"
