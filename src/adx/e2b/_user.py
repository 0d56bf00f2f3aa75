"""Who an envd call acts as: E2B's ``user`` unless the SDK names another account.

The SDK names it per call (``user=`` of ``commands.run``, ``files.*``, ``pty.create``, ``watch_dir``): as
``Authorization: Basic base64("NAME:")`` on the RPCs and as the ``username`` query of ``/files`` (which a signed
URL's signature covers). Without either, envd acts as its default account, ``user`` (home ``/home/user``); execd
creates that account on first use when the image lacks it (:mod:`adx.execd._accounts`). Relative paths and
``~/`` are resolved by execd against the account's home, and what it creates belongs to the account.
"""

from __future__ import annotations

import binascii

from starlette.requests import Request

from adx.e2b._connect import RpcError

__all__ = ["DEFAULT_USER", "envd_user"]

#: E2B's default account.
DEFAULT_USER = "user"


def envd_user(request: Request) -> str:
    """The account a call names (``username`` query, else the Basic authorization header), else ``user``."""
    named = request.query_params.get("username")
    if named:
        return named
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value.strip():
        return DEFAULT_USER
    try:
        decoded = binascii.a2b_base64(value.strip().encode()).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise RpcError("invalid_argument", "Authorization: not a valid Basic credential (base64 of 'user:')") from None
    name = decoded.partition(":")[0]
    return name or DEFAULT_USER
