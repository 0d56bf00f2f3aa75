"""The node's gRPC API (mutual TLS): admit, delete, pause and resume for the Coordinator and the API server,
usage and the node's own view of an Environment for the API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING

import grpc

from adx._grpc_errors import abort_with
from adx._grpc_serve import serve
from adx.errors import AdxError, InvalidInputError, NotFoundError
from adx.model import EnvironmentLogs, EnvironmentRecord, EnvironmentStats
from adx.node._image_pull import image_reply, layer_chunks
from adx.proto import node_pb2, node_pb2_grpc

if TYPE_CHECKING:
    from adx.node._agent import NodeAgent
    from adx.node._controller import Controller

Context = grpc.aio.ServicerContext[object, object]


class NodeService(node_pb2_grpc.NodeServicer):
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    async def AdmitEnvironment(
        self, request: node_pb2.AdmitEnvironmentRequest, context: Context
    ) -> node_pb2.AdmitEnvironmentResponse:
        admitted = await self._hand_over(context, request.environment_json, self.agent.admit, "coordinator")
        return node_pb2.AdmitEnvironmentResponse(environment_json=admitted)

    async def DeleteEnvironment(
        self, request: node_pb2.DeleteEnvironmentRequest, context: Context
    ) -> node_pb2.DeleteEnvironmentResponse:
        queued = await self._hand_over(context, request.environment_json, self.agent.delete, "coordinator", "api")
        return node_pb2.DeleteEnvironmentResponse(environment_json=queued)

    async def PauseEnvironment(
        self, request: node_pb2.PauseEnvironmentRequest, context: Context
    ) -> node_pb2.PauseEnvironmentResponse:
        async def work() -> EnvironmentRecord:
            return await self.agent.pause(_record_arg(request.environment_json), request.timeout_seconds or 330.0)

        paused = await serve(context, work, "coordinator", "api")
        return node_pb2.PauseEnvironmentResponse(environment_json=paused.model_dump_json(by_alias=True))

    async def ResumeEnvironment(
        self, request: node_pb2.ResumeEnvironmentRequest, context: Context
    ) -> node_pb2.ResumeEnvironmentResponse:
        queued = await self._hand_over(context, request.environment_json, self.agent.resume, "coordinator")
        return node_pb2.ResumeEnvironmentResponse(environment_json=queued)

    async def _hand_over(
        self, context: Context, text: str, queue: Callable[[EnvironmentRecord], EnvironmentRecord], *peers: str
    ) -> str:
        """Admit, delete, resume: the record in ``text`` handed to the agent, and its answer as JSON."""

        async def work() -> EnvironmentRecord:
            return queue(_record_arg(text))

        return (await serve(context, work, *peers)).model_dump_json(by_alias=True)

    async def EnvironmentStats(
        self, request: node_pb2.EnvironmentStatsRequest, context: Context
    ) -> node_pb2.EnvironmentStatsResponse:
        async def work() -> EnvironmentStats:
            return await self.agent.metrics.stats_of(self._held(request.environment_id, request.tenant))

        stats = await serve(context, work, "api")
        return node_pb2.EnvironmentStatsResponse(stats_json=stats.model_dump_json(by_alias=True))

    async def DescribeEnvironment(
        self, request: node_pb2.DescribeEnvironmentRequest, context: Context
    ) -> node_pb2.DescribeEnvironmentResponse:
        async def work() -> Controller:
            return self._held(request.environment_id, request.tenant)

        controller = await serve(context, work, "api")
        return node_pb2.DescribeEnvironmentResponse(
            environment_json=controller.record.model_dump_json(by_alias=True),
            publication_pending=controller.publication_pending,
            journaled=controller.unpublished > 0,
        )

    async def EnvironmentLogs(
        self, request: node_pb2.EnvironmentLogsRequest, context: Context
    ) -> node_pb2.EnvironmentLogsResponse:
        async def work() -> EnvironmentLogs:
            self._held(request.environment_id, request.tenant)
            return await self.agent.logs.read(
                request.environment_id,
                cursor=request.cursor,
                tail=request.tail if request.HasField("tail") else None,
                since=request.since,
                limit=request.limit,
                wait_seconds=request.wait_seconds,
            )

        logs = await serve(context, work, "api")
        return node_pb2.EnvironmentLogsResponse(logs_json=logs.model_dump_json(by_alias=True))

    # -- images, for other nodes (issue 13) --------------------------------------------------------------------
    async def GetImage(self, request: node_pb2.GetImageRequest, context: Context) -> node_pb2.GetImageResponse:
        async def work() -> node_pb2.GetImageResponse:
            store = await self.agent.images.store()
            return await asyncio.to_thread(image_reply, store, request.name)

        return await serve(context, work, "node")

    async def PullLayer(
        self, request: node_pb2.PullLayerRequest, context: Context
    ) -> AsyncIterator[node_pb2.LayerChunk]:
        async def work() -> AsyncGenerator[node_pb2.LayerChunk, None]:
            return layer_chunks(await self.agent.images.store(), request.digest)

        chunks = await serve(context, work, "node")
        try:
            async with contextlib.aclosing(chunks):  # a cancelled call stops the layer's tar at once
                async for chunk in chunks:
                    yield chunk
        except AdxError as exc:
            await abort_with(context, exc)

    def _held(self, env_id: str, tenant: str) -> Controller:
        """The Controller of ``env_id``; NotFoundError unless this node holds it for ``tenant`` (another tenant's
        is not found)."""
        controller = self.agent.controllers.get(env_id)
        if controller is None or controller.record.tenant != tenant:
            raise NotFoundError(f"environment {env_id} is not on node {self.agent.name}")
        return controller


def _record_arg(text: str) -> EnvironmentRecord:
    try:
        return EnvironmentRecord.model_validate_json(text)
    except ValueError as exc:
        raise InvalidInputError("environmentJson", str(exc)) from None
