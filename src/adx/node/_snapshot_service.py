"""The node's snapshot capture (NodeSnapshots, called by the Coordinator): the owning Controller freezes the
running execution, captures its filesystem checkpoint and thaws it, in its operation queue (the Snapshot
operation), and hands the artifact back without the Environment's record referencing it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc

from adx._grpc_errors import abort_with
from adx._grpc_tls import require_peer
from adx.errors import AdxError, InvalidInputError
from adx.model import CheckpointRef, EnvironmentRecord
from adx.node._operations import Snapshot
from adx.proto import snapshots_pb2, snapshots_pb2_grpc

if TYPE_CHECKING:
    from adx.node._agent import NodeAgent

Context = grpc.aio.ServicerContext[object, object]


class NodeSnapshotsService(snapshots_pb2_grpc.NodeSnapshotsServicer):
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    async def CaptureSnapshot(
        self, request: snapshots_pb2.CaptureSnapshotRequest, context: Context
    ) -> snapshots_pb2.CaptureSnapshotReply:
        await require_peer(context, "coordinator")
        try:
            if not request.operation_id:
                raise InvalidInputError("operationId", "required")
            record = EnvironmentRecord.model_validate_json(request.environment_json)
            checkpoint = await capture(self.agent, record, request.operation_id)
        except AdxError as exc:
            await abort_with(context, exc)
        except ValueError as exc:
            await abort_with(context, InvalidInputError("environmentJson", f"is not an Environment record: {exc}"))
        return snapshots_pb2.CaptureSnapshotReply(checkpoint_json=checkpoint.model_dump_json(by_alias=True))


async def capture(agent: NodeAgent, record: EnvironmentRecord, operation_id: str) -> CheckpointRef:
    """Queue the capture behind the Controller's earlier operations and wait for its artifact. A caller that goes
    away (the RPC is cancelled) cancels the future: the Controller then deletes what it captured."""
    controller = agent.owned_controller(record)
    result: asyncio.Future[CheckpointRef] = asyncio.get_running_loop().create_future()
    controller.submit(Snapshot(operation_id, result))
    return await result
