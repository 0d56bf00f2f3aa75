"""HTTP answers and transport failures, translated into the ``adx.errors`` families (the SDK's one root)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from adx.errors import (
    AdxError,
    AuthenticationError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
    error_type,
    rebuild_error,
)
from adx.errors import WaitTimeoutError as StateWaitTimeoutError


class WaitTimeoutError(StateWaitTimeoutError):
    """An Environment did not reach ``running`` in time. It exists: wait again, or delete it.

    ``environment`` is the last state the SDK saw.
    """

    def __init__(self, message: str, environment: Any) -> None:
        super().__init__(message, details={"id": getattr(environment, "id", None)})
        self.environment = environment


class BadResponseError(AdxError):
    """The server answered with something that is not the documented shape."""

    code = "bad_response"


def _parse_error(body: bytes) -> tuple[str | None, str | None, dict[str, object]]:
    try:
        data = json.loads(body)
        error = data["error"]
        details = error.get("details") or {}
        return str(error.get("code") or ""), str(error.get("message") or ""), dict(details)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None, {}


def error_code(body: bytes) -> str | None:
    return _parse_error(body)[0]


def error_from_response(method: str, status: int, body: bytes, what: str, api_url: str = "") -> AdxError:
    code, message, details = _parse_error(body)
    text = message or body[:300].decode("utf-8", "replace").strip() or f"HTTP {status}"
    exc: AdxError
    known = error_type(code or "")
    if status in (401, 403):
        where = f"the ADX API at {api_url}" if api_url else "the ADX API"
        exc = AuthenticationError(
            "api_key",
            f"{where} refused the key ({text.removeprefix('Authorization: ')}): pass the right one (api_key=, "
            "ADX_API_KEY, --api-key) or make one with `adx tenant create NAME`",
        )
    elif known is not None and known.http_status == status:
        # The server named its error and the status agrees: the exact subclass it raised (adx.errors' table).
        exc = rebuild_error(known, known.code, text if status < 500 else f"{what}: {text}", details)
    elif status in (400, 422):
        field = str(details.get("field", ""))
        exc = InvalidInputError(field, str(details.get("reason") or text.removeprefix(f"{field}: ")))
    elif status == 404:
        exc = NotFoundError(text)
    elif status == 409:
        exc = ConflictError(text)
    elif status == 504 or (status >= 500 and method not in ("GET", "HEAD")):
        # The request reached the server and its outcome is unknown (a 503 never acted: see below).
        exc = UncertainOutcomeError(f"{what}: {text}") if status != 503 else UnavailableError(f"{what}: {text}")
    elif status >= 500:
        exc = UnavailableError(f"{what}: {text}")
    else:
        exc = AdxError(f"{what}: HTTP {status}: {text}")
    if code:
        exc.code = code
    exc.details.update({k: v for k, v in details.items() if k not in exc.details})
    exc.details["httpStatus"] = status
    return exc


def _api_at(exc: httpx.HTTPError) -> str:
    try:
        url = exc.request.url
    except RuntimeError:  # an error raised before any request was built
        return "the ADX API"
    return f"the ADX API at {url.scheme}://{url.netloc.decode()}"


def transport_error(exc: httpx.HTTPError, what: str, *, sent: bool) -> AdxError:
    """``sent``: the request may have reached the server (then only the server knows what happened)."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout) or not sent:
        return UnavailableError(
            f"{what}: cannot reach {_api_at(exc)} ({exc}): is the server running, and is the URL right?"
        )
    if isinstance(exc, httpx.TimeoutException):
        return UncertainOutcomeError(
            f"{what}: no answer in time ({type(exc).__name__}); it may or may not have happened"
        )
    return UncertainOutcomeError(
        f"{what}: the connection failed mid-request ({exc!r}); it may or may not have happened"
    )
