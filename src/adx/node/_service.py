"""The node's gRPC API (mutual TLS): admit, delete, pause and resume for the Coordinator and the API server,
usage and the node's own view of an Environment for the API server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from adx._grpc_errors import abort_with
from adx._grpc_tls import require_peer
from adx.errors import AdxError, InvalidInputError, NotFoundError
from adx.model import EnvironmentRecord
from adx.proto import node_pb2, node_pb2_grpc

if TYPE_CHECKING:
    from adx.node._agent import NodeAgent

Context = grpc.aio.ServicerContext[object, object]


class NodeService(node_pb2_grpc.NodeServicer):
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    async def AdmitEnvironment(
        self, request: node_pb2.AdmitEnvironmentRequest, context: Context
    ) -> node_pb2.AdmitEnvironmentResponse:
        await require_peer(context, "coordinator")
        try:
            record = EnvironmentRecord.model_validate_json(request.environment_json)
            admitted = self.agent.admit(record)
        except AdxError as exc:
            await abort_with(context, exc)
        except ValueError as exc:
            await abort_with(context, InvalidInputError("environmentJson", str(exc)))
        return node_pb2.AdmitEnvironmentResponse(environment_json=admitted.model_dump_json(by_alias=True))

    async def DeleteEnvironment(
        self, request: node_pb2.DeleteEnvironmentRequest, context: Context
    ) -> node_pb2.DeleteEnvironmentResponse:
        await require_peer(context, "coordinator", "api")
        try:
            record = EnvironmentRecord.model_validate_json(request.environment_json)
            queued = self.agent.delete(record)
        except AdxError as exc:
            await abort_with(context, exc)
        except ValueError as exc:
            await abort_with(context, InvalidInputError("environmentJson", str(exc)))
        return node_pb2.DeleteEnvironmentResponse(environment_json=queued.model_dump_json(by_alias=True))

    async def PauseEnvironment(
        self, request: node_pb2.PauseEnvironmentRequest, context: Context
    ) -> node_pb2.PauseEnvironmentResponse:
        await require_peer(context, "coordinator", "api")
        try:
            record = _record_arg(request.environment_json)
            paused = await self.agent.pause(record, request.timeout_seconds or 330.0)
        except AdxError as exc:
            await abort_with(context, exc)
        return node_pb2.PauseEnvironmentResponse(environment_json=paused.model_dump_json(by_alias=True))

    async def ResumeEnvironment(
        self, request: node_pb2.ResumeEnvironmentRequest, context: Context
    ) -> node_pb2.ResumeEnvironmentResponse:
        await require_peer(context, "coordinator")
        try:
            queued = self.agent.resume(_record_arg(request.environment_json))
        except AdxError as exc:
            await abort_with(context, exc)
        return node_pb2.ResumeEnvironmentResponse(environment_json=queued.model_dump_json(by_alias=True))

    async def EnvironmentStats(
        self, request: node_pb2.EnvironmentStatsRequest, context: Context
    ) -> node_pb2.EnvironmentStatsResponse:
        await require_peer(context, "api")
        try:
            controller = self.agent.controllers.get(request.environment_id)
            if controller is None or controller.record.tenant != request.tenant:
                raise NotFoundError(f"environment {request.environment_id} is not on node {self.agent.name}")
            stats = await self.agent.metrics.stats_of(controller)
        except AdxError as exc:
            await abort_with(context, exc)
        return node_pb2.EnvironmentStatsResponse(stats_json=stats.model_dump_json(by_alias=True))

    async def DescribeEnvironment(
        self, request: node_pb2.DescribeEnvironmentRequest, context: Context
    ) -> node_pb2.DescribeEnvironmentResponse:
        await require_peer(context, "api")
        try:
            controller = self.agent.controllers.get(request.environment_id)
            if controller is None or controller.record.tenant != request.tenant:
                raise NotFoundError(f"environment {request.environment_id} is not on node {self.agent.name}")
        except AdxError as exc:
            await abort_with(context, exc)
        return node_pb2.DescribeEnvironmentResponse(
            environment_json=controller.record.model_dump_json(by_alias=True),
            publication_pending=controller.publication_pending,
            journaled=controller.unpublished > 0,
        )

    async def EnvironmentLogs(
        self, request: node_pb2.EnvironmentLogsRequest, context: Context
    ) -> node_pb2.EnvironmentLogsResponse:
        await require_peer(context, "api")
        try:
            self._held(request.environment_id, request.tenant)
            logs = await self.agent.logs.read(
                request.environment_id,
                cursor=request.cursor,
                tail=request.tail if request.HasField("tail") else None,
                since=request.since,
                limit=request.limit,
                wait_seconds=request.wait_seconds,
            )
        except AdxError as exc:
            await abort_with(context, exc)
        return node_pb2.EnvironmentLogsResponse(logs_json=logs.model_dump_json(by_alias=True))

    def _held(self, env_id: str, tenant: str) -> None:
        """NotFoundError unless this node holds ``env_id`` for ``tenant`` (another tenant's is not found)."""
        controller = self.agent.controllers.get(env_id)
        if controller is None or controller.record.tenant != tenant:
            raise NotFoundError(f"environment {env_id} is not on node {self.agent.name}")


def _record_arg(text: str) -> EnvironmentRecord:
    try:
        return EnvironmentRecord.model_validate_json(text)
    except ValueError as exc:
        raise InvalidInputError("environmentJson", str(exc)) from None
