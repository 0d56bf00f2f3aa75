"""Signed file URLs: ``download_url`` / ``upload_url`` of the ``e2b`` SDK (E2B's "v1" signature).

The SDK signs ``path:operation:user:token[:expiration]`` with SHA-256 (base64, no padding, ``v1_`` prefix),
where ``operation`` is ``read`` (GET) or ``write`` (POST), ``user`` the ``username`` query value ('' when
absent) and ``token`` the sandbox's envd access token; ``signature_expiration`` is a Unix time. Only someone
holding the token can make one, so a valid signature authenticates the request as the token's tenant and
sandbox, for that path and operation only. Refusals are envd's: 401 ``{"code": 401, "message"}``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from starlette.requests import Request

from adx.e2b._files import HttpFailure
from adx.e2b._tokens import EnvdTokens

PREFIX = "v1_"
_OPERATIONS = {"GET": "read", "HEAD": "read", "POST": "write"}


def signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration is not None else "")
    digest = hashlib.sha256(raw.encode()).digest()
    return PREFIX + base64.b64encode(digest).decode().rstrip("=")


def is_signed(request: Request) -> bool:
    """A request to envd's ``/files`` that carries a signature (set, even empty) instead of an access token."""
    return request.url.path == "/files" and "signature" in request.query_params


def _expiration(request: Request) -> int | None:
    value = request.query_params.get("signature_expiration")
    if value is None or value == "":
        return None
    if not value.isdigit():
        raise HttpFailure(401, f"signature_expiration must be a Unix time in seconds, got {value[:40]!r}")
    return int(value)


def _matches(request: Request, token: str, expiration: int | None) -> bool:
    operation = _OPERATIONS.get(request.method)
    given = request.query_params.get("signature", "")
    if operation is None or not given.startswith(PREFIX):
        return False
    path = request.query_params.get("path", "")
    user = request.query_params.get("username", "")
    return hmac.compare_digest(given.encode(), signature(path, operation, user, token, expiration).encode())


def _fresh(expiration: int | None) -> None:
    if expiration is not None and expiration < time.time():
        raise HttpFailure(401, "signature is already expired")


def check(tokens: EnvdTokens, tenant: str, sandbox_id: str, request: Request) -> None:
    """The signature was made with this sandbox's token for this request's path, user and operation, and has
    not expired; else 401."""
    if not request.query_params.get("signature"):
        raise HttpFailure(401, "missing signature")
    expiration = _expiration(request)
    if request.method not in _OPERATIONS:
        raise HttpFailure(401, f"a signed URL is for GET (read) or POST (write), not {request.method}")
    if not _matches(request, tokens.token(tenant, sandbox_id), expiration):
        raise HttpFailure(401, "invalid signature")
    _fresh(expiration)


def find(tokens: EnvdTokens, request: Request) -> tuple[str, str]:
    """(tenant, sandbox) whose token made this URL's signature: a URL at ``E2B_SANDBOX_URL`` names no sandbox,
    so the candidates (the sandboxes this API process knows, :class:`KnownSandboxes`) are tried in turn."""
    if not request.query_params.get("signature"):
        raise HttpFailure(401, "missing signature")
    expiration = _expiration(request)
    for tenant, sandbox_id in tokens.known.recent_first():
        if _matches(request, tokens.token(tenant, sandbox_id), expiration):
            _fresh(expiration)
            return tenant, sandbox_id
    raise HttpFailure(
        401,
        "invalid signature (or a sandbox this API server has not served since it started: "
        "Sandbox.connect(id) and sign again, or use the host-name form, docs/e2b.md)",
    )
