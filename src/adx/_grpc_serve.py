"""The frame of a gRPC handler that serves other ADX components: check the caller's certificate (SEC-1), do the
work, and end the call with the status of the ADX error the work raised."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from adx._grpc_errors import abort_with
from adx._grpc_tls import require_peer
from adx.errors import AdxError

T = TypeVar("T")


async def serve(context: grpc.aio.ServicerContext[object, object], work: Callable[[], Awaitable[T]], *peers: str) -> T:
    """``work()``'s result, for a caller whose certificate names one of ``peers``."""
    await require_peer(context, *peers)
    try:
        return await work()
    except AdxError as exc:
        await abort_with(context, exc)
