"""sandboxd's one error that fits no ``adx.errors`` family: the caller is not allowed (SBX-4)."""

from __future__ import annotations

from adx.errors import AdxError

__all__ = ["PermissionDeniedError"]


class PermissionDeniedError(AdxError):
    """Wrong peer UID, owner or sandbox token. Retrying with the same credentials fails again."""

    code = "permission_denied"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"
