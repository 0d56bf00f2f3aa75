"""The gRPC ``Health`` service every ADX daemon serves, and the client call to ask it."""

from __future__ import annotations

import grpc

from adx.errors import NotFoundError, UnavailableError
from adx.proto import health_pb2, health_pb2_grpc

__all__ = ["HealthServicer", "check_health"]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Tracks the serving status of a daemon (service ``""``) and of its named sub-services."""

    def __init__(self, component: str) -> None:
        self.component = component
        self._status: dict[str, tuple[int, str]] = {"": (NOT_SERVING, "starting")}

    def set_serving(self, service: str = "") -> None:
        self._status[service] = (SERVING, "")

    def set_not_serving(self, reason: str, service: str = "") -> None:
        self._status[service] = (NOT_SERVING, reason)

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> health_pb2.HealthCheckResponse:
        try:
            status, detail = self._status[request.service]
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status, detail=detail, component=self.component)  # type: ignore[arg-type]


async def check_health(
    channel: grpc.aio.Channel, service: str = "", rpc_timeout: float = 5.0
) -> health_pb2.HealthCheckResponse:
    """Ask a daemon's Health service; translate transport failures into ADX errors."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        response: health_pb2.HealthCheckResponse = await stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=rpc_timeout
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            raise NotFoundError(exc.details() or f"unknown service {service!r}") from None
        raise UnavailableError(f"health check failed: {exc.code().name}: {exc.details()}") from None
    return response
