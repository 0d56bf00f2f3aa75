"""HTTP error bodies: ``{"error": {"code", "message", "details"}}`` with the status of the error's family."""

from __future__ import annotations

import logging
import math
from typing import TypedDict

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from adx.errors import AdxError, AuthenticationError, ErrorDetails, InvalidInputError, NotFoundError
from adx.model import field_path

log = logging.getLogger("adx.api")


class _ErrorWire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class ErrorDetail(_ErrorWire):
    code: str = Field(description="stable machine-readable code, e.g. invalid_input, not_found, no_capacity")
    message: str
    details: dict[str, object] = Field(default_factory=dict, description="e.g. {'field': 'resources.cpuMillis'}")


class ErrorBody(_ErrorWire):
    error: ErrorDetail


class Unauthenticated(AuthenticationError):
    """No API key, a malformed Authorization header, or a key no tenant owns (HTTP 401)."""

    def __init__(self, reason: str) -> None:
        super().__init__("Authorization", reason)


def status_for(exc: AdxError) -> int:
    """The HTTP status an error is answered with: the one its class declares (``adx.errors``)."""
    return exc.http_status


class ErrorWire(TypedDict):
    code: str
    message: str
    details: ErrorDetails


class ErrorBodyWire(TypedDict):
    """Every error answer's JSON (``ErrorBody`` is its published schema)."""

    error: ErrorWire


def error_body(code: str, message: str, details: ErrorDetails | None = None) -> ErrorBodyWire:
    return {"error": {"code": code, "message": message, "details": jsonable_encoder(details or {})}}


def retry_after_seconds(exc: AdxError) -> int:
    """A 503/504's ``Retry-After``: RFC 9110 whole seconds; the cluster's own hint (a refused resume's capacity
    round, a create no node admits now) when it gave one, else 1."""
    return max(1, math.ceil(float(exc.details.get("retry_after_seconds", 1))))


def error_response(exc: AdxError) -> JSONResponse:
    status = status_for(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    details = exc.details
    if status in (503, 504):
        # The body says the same as the header, for clients that do not read headers.
        retry_after = retry_after_seconds(exc)
        headers = {"Retry-After": str(retry_after)}
        details = {**details, "retry_after_seconds": details.get("retry_after_seconds", retry_after)}
    return JSONResponse(error_body(exc.code, exc.message, details), status_code=status, headers=headers)


def not_found(environment_id: str) -> NotFoundError:
    """SEC-2: one message for "does not exist" and "belongs to another tenant", built from the request only."""
    return NotFoundError(f"environment {environment_id} not found")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of this path takes. Starlette's 405 names only the methods of the first route
    whose path matched, and one path is several routes here (GET and DELETE of an Environment). Each method
    is tried against the router's routes through their public ``matches`` (included routers nest)."""
    router = request.scope.get("router") or request.app.router
    return [
        method
        for method in _HTTP_METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in router.routes)
    ]


_HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def install_error_handlers(app: FastAPI) -> None:
    async def adx_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AdxError)
        if status_for(exc) >= 500:
            log.warning("request failed: %s", exc, extra={"path": request.url.path, "code": exc.code})
        return error_response(exc)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):
            # FastAPI's "error parsing the body" (e.g. bytes that are not UTF-8): the same 422 naming the body
            # as every route that reads its JSON itself answers.
            return error_response(InvalidInputError("body", f"is not valid JSON: {exc.__cause__}"))
        codes = {404: "not_found", 405: "method_not_allowed"}
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return JSONResponse(
            error_body(codes.get(exc.status_code, "http_error"), str(exc.detail)),
            status_code=exc.status_code,
            headers=headers,
        )

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = tuple(first.get("loc", ()))
        if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
            loc = loc[1:]  # where it was, not what: only the first part (a query parameter may be named `path`)
        return error_response(InvalidInputError(field_path(loc), str(first.get("msg", "invalid"))))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", extra={"path": request.url.path})
        return JSONResponse(error_body("internal", "internal error"), status_code=500)

    app.add_exception_handler(AdxError, adx_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)
