"""Structured logging and the error hierarchy."""

from __future__ import annotations

import io
import json
import logging

import pytest

import adx.errors
from adx.errors import (
    AdxError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.logs import configure_logging


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_component_and_context(restore_root_logger) -> None:
    out = io.StringIO()
    configure_logging("coordinator", "debug", "json", stream=out)
    logging.getLogger("adx.test").info("committed %s", "env-1", extra={"env_id": "env-1", "generation": 3})
    line = json.loads(out.getvalue().strip())
    assert line["component"] == "coordinator"
    assert line["msg"] == "committed env-1"
    assert (line["env_id"], line["generation"], line["level"]) == ("env-1", 3, "info")


def test_kv_lines_quote_values_with_spaces(restore_root_logger) -> None:
    out = io.StringIO()
    configure_logging("node", "info", "kv", stream=out)
    logging.getLogger("adx.test").warning("two words", extra={"env_id": "e1"})
    logging.getLogger("adx.test").debug("hidden below the level")
    text = out.getvalue()
    assert "component=node" in text and 'msg="two words"' in text and "env_id=e1" in text
    assert "hidden" not in text
    assert len(text.strip().splitlines()) == 1


def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("x", "loud")


def test_error_families_share_one_root() -> None:
    for family in (InvalidInputError, NotFoundError, ConflictError, UnavailableError, UncertainOutcomeError):
        assert issubclass(family, AdxError)
    err = InvalidInputError("resources.cpuMillis", "must be positive")
    assert str(err) == "resources.cpuMillis: must be positive"
    assert err.details == {"field": "resources.cpuMillis", "reason": "must be positive"}
    assert len({f.code for f in AdxError.__subclasses__()}) == len(AdxError.__subclasses__())


def test_public_exports_are_honest() -> None:
    for name in adx.errors.__all__:
        assert hasattr(adx.errors, name)
    public = {n for n, v in vars(adx.errors).items() if isinstance(v, type) and issubclass(v, AdxError)}
    assert public | {"error_for_http", "error_type", "rebuild_error"} == set(adx.errors.__all__)


@pytest.fixture
def loopback_http_url():
    """A real HTTP server on loopback that answers 200 to every GET (what a health probe polls)."""
    import http.server
    import threading

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_client_requests_are_not_logged_at_info(restore_root_logger, loopback_http_url) -> None:
    """`adx up` polled /healthz once a second and logged every poll ("HTTP Request: GET ... 200 OK") at info:
    the HTTP client's per-request lines show at debug only."""
    import httpx

    stream = io.StringIO()
    configure_logging("up", "info", "kv", stream=stream)
    for _ in range(3):
        assert httpx.get(f"{loopback_http_url}/healthz", timeout=5).status_code == 200
    assert "HTTP Request" not in stream.getvalue()

    configure_logging("up", "debug", "kv", stream=stream)
    httpx.get(f"{loopback_http_url}/healthz", timeout=5)
    assert "HTTP Request" in stream.getvalue()


def test_a_librarys_terminal_colouring_is_not_context(restore_root_logger) -> None:
    """uvicorn passes its ANSI-coloured copy of a message as extra "color_message"; it leaked into every line
    (seen in adx up's output: color_message="Finished server process [\\u001b[36m%d\\u001b[0m]")."""
    out = io.StringIO()
    configure_logging("api", "info", "kv", stream=out)
    # A logger of our own: the point is the formatter (uvicorn.error may be quieted by other tests' servers).
    logging.getLogger("adx.test.uvicorn_like").info(
        "Finished server process [%d]", 42, extra={"color_message": "Finished server process [\x1b[36m%d\x1b[0m]"}
    )
    text = out.getvalue()
    assert 'msg="Finished server process [42]"' in text
    assert "color_message" not in text and "\x1b" not in text
