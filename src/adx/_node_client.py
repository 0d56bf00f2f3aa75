"""Calls to a node's gRPC API (mutual TLS): the Coordinator's, and the API server's for pause (CRD-1) and
usage (MET-1)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import grpc

from adx._grpc_errors import from_rpc_error
from adx.model import CheckpointRef, EnvironmentLogs, EnvironmentRecord, EnvironmentStats
from adx.proto import node_pb2 as pb
from adx.proto import node_pb2_grpc as pb_grpc
from adx.proto import snapshots_pb2, snapshots_pb2_grpc

if TYPE_CHECKING:
    from adx.proto.node_pb2_grpc import NodeAsyncStub

R = TypeVar("R")


@dataclass(frozen=True)
class NodeView:
    """An Environment as its node holds it: possibly ahead of the Coordinator (a result not yet published)."""

    record: EnvironmentRecord
    publication_pending: bool
    journaled: bool


class NodeClients:
    """One channel per node address, reused across calls."""

    def __init__(self, credentials: grpc.ChannelCredentials, rpc_timeout: float = 10.0) -> None:
        self.credentials = credentials
        self.rpc_timeout = rpc_timeout
        self._channels: dict[str, tuple[grpc.aio.Channel, NodeAsyncStub]] = {}

    def _stub(self, address: str) -> NodeAsyncStub:
        if address not in self._channels:
            channel = grpc.aio.secure_channel(address, self.credentials)
            self._channels[address] = (channel, pb_grpc.NodeStub(channel))
        return self._channels[address][1]

    async def _call(
        self, what: str, address: str, record: EnvironmentRecord, call: Callable[[], Awaitable[_RecordReply]]
    ) -> EnvironmentRecord:
        reply = await _rpc(f"{what} {record.id} on {address}", call)
        return EnvironmentRecord.model_validate_json(reply.environment_json)

    async def admit(self, address: str, record: EnvironmentRecord) -> EnvironmentRecord:
        request = pb.AdmitEnvironmentRequest(environment_json=record.model_dump_json(by_alias=True))
        stub = self._stub(address)
        return await self._call(
            "admit", address, record, lambda: stub.AdmitEnvironment(request, timeout=self.rpc_timeout)
        )

    async def delete(self, address: str, record: EnvironmentRecord) -> EnvironmentRecord:
        request = pb.DeleteEnvironmentRequest(environment_json=record.model_dump_json(by_alias=True))
        stub = self._stub(address)
        return await self._call(
            "delete", address, record, lambda: stub.DeleteEnvironment(request, timeout=self.rpc_timeout)
        )

    async def pause(self, address: str, record: EnvironmentRecord, *, wait_seconds: float) -> EnvironmentRecord:
        """Returns once the node committed the pause (its capture bounded by the pause options' timeout)."""
        request = pb.PauseEnvironmentRequest(
            environment_json=record.model_dump_json(by_alias=True), timeout_seconds=wait_seconds
        )
        stub = self._stub(address)
        return await self._call(
            "pause", address, record, lambda: stub.PauseEnvironment(request, timeout=wait_seconds + self.rpc_timeout)
        )

    async def capture_snapshot(
        self, address: str, record: EnvironmentRecord, operation_id: str, *, wait_seconds: float
    ) -> CheckpointRef:
        """A checkpoint of the running Environment the record does not reference (a snapshot's artifact)."""
        self._stub(address)
        stub = snapshots_pb2_grpc.NodeSnapshotsStub(self._channels[address][0])
        request = snapshots_pb2.CaptureSnapshotRequest(
            environment_json=record.model_dump_json(by_alias=True), operation_id=operation_id
        )
        reply = await _rpc(
            f"snapshot {record.id} on {address}",
            lambda: stub.CaptureSnapshot(request, timeout=wait_seconds + self.rpc_timeout),
        )
        return CheckpointRef.model_validate_json(reply.checkpoint_json)

    async def resume(self, address: str, record: EnvironmentRecord) -> EnvironmentRecord:
        """Returns once the node queued the resume; Running is committed by the node later."""
        request = pb.ResumeEnvironmentRequest(environment_json=record.model_dump_json(by_alias=True))
        stub = self._stub(address)
        return await self._call(
            "resume", address, record, lambda: stub.ResumeEnvironment(request, timeout=self.rpc_timeout)
        )

    async def stats(self, address: str, tenant: str, environment_id: str) -> EnvironmentStats:
        """The node's last usage sample of a running Environment (MET-1); it never wakes a paused one."""
        request = pb.EnvironmentStatsRequest(environment_id=environment_id, tenant=tenant)
        stub = self._stub(address)
        reply = await _rpc(
            f"stats of {environment_id} on {address}", lambda: stub.EnvironmentStats(request, timeout=self.rpc_timeout)
        )
        return EnvironmentStats.model_validate_json(reply.stats_json)

    async def logs(
        self,
        address: str,
        tenant: str,
        environment_id: str,
        *,
        cursor: str = "",
        tail: int | None = None,
        since: str = "",
        limit: int = 0,
        wait_seconds: float = 0.0,
    ) -> EnvironmentLogs:
        """The workload output the node keeps for an Environment (waits up to ``wait_seconds`` for a line)."""
        request = pb.EnvironmentLogsRequest(
            environment_id=environment_id,
            tenant=tenant,
            cursor=cursor,
            tail=tail,
            since=since,
            limit=limit,
            wait_seconds=wait_seconds,
        )
        stub = self._stub(address)
        reply = await _rpc(
            f"logs of {environment_id} on {address}",
            lambda: stub.EnvironmentLogs(request, timeout=self.rpc_timeout + wait_seconds),
        )
        return EnvironmentLogs.model_validate_json(reply.logs_json)

    async def describe(self, address: str, tenant: str, environment_id: str) -> NodeView:
        """The node's own view of an Environment it holds (JRN-4: the answer while the Coordinator is away)."""
        request = pb.DescribeEnvironmentRequest(environment_id=environment_id, tenant=tenant)
        stub = self._stub(address)
        reply = await _rpc(
            f"describe {environment_id} on {address}",
            lambda: stub.DescribeEnvironment(request, timeout=self.rpc_timeout),
        )
        return NodeView(
            EnvironmentRecord.model_validate_json(reply.environment_json), reply.publication_pending, reply.journaled
        )

    async def close(self) -> None:
        for channel, _ in self._channels.values():
            await channel.close(None)
        self._channels.clear()


class _RecordReply(Protocol):
    """The node's replies that carry the Environment record it committed or queued."""

    @property
    def environment_json(self) -> str: ...


async def _rpc(what: str, call: Callable[[], Awaitable[R]]) -> R:
    """One call to a node; its gRPC error as the ADX error it stands for, naming ``what`` was asked."""
    try:
        return await call()
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc, what) from None
