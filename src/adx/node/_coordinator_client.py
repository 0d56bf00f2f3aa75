"""The node's side of the Coordinator API: the ResultSink its Controllers commit through."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from adx._grpc_errors import from_rpc_error
from adx.model import CheckpointRef, EnvironmentRecord
from adx.model._records import RecordChanges
from adx.node._replay import WireCommit
from adx.proto import coordinator_pb2 as pb

if TYPE_CHECKING:
    from adx.proto.coordinator_pb2_grpc import CoordinatorAsyncStub


class CoordinatorSink:
    """Commits results with the node's identity and current session (CRD-1, CRD-4)."""

    def __init__(self, stub: CoordinatorAsyncStub, node: str, session: Callable[[], str], rpc_timeout: float) -> None:
        self.stub = stub
        self.node = node
        # ``session`` is a zero-argument callable: the session changes when the node registers again.
        self._session = session
        self.rpc_timeout = rpc_timeout
        # CRD-9: retired artifacts this node can reach, as of the last catalog read.
        self.retired_checkpoints: list[CheckpointRef] = []
        # CRD-9: every checkpoint the cluster references, as of the last catalog read that asked for it.
        self.referenced_checkpoints: set[str] | None = None

    async def commit(
        self, record: EnvironmentRecord, changes: RecordChanges, *, release_reservation: bool = False
    ) -> EnvironmentRecord:
        wire = wire_changes(record, changes)
        return await self.commit_wire(
            WireCommit(record.id, record.revision, record.generation, wire, release_reservation=release_reservation)
        )

    async def commit_wire(self, commit: WireCommit) -> EnvironmentRecord:
        request = pb.CommitResultRequest(
            node=self.node,
            session=self._session(),
            environment_id=commit.env_id,
            expected_revision=commit.expected_revision,
            expected_generation=commit.expected_generation,
            changes_json=json.dumps(commit.changes),
            release_reservation=commit.release_reservation,
        )
        try:
            reply = await self.stub.CommitResult(request, timeout=self.rpc_timeout)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, f"commit {commit.env_id}") from None
        return EnvironmentRecord.model_validate_json(reply.environment_json)

    async def catalog(self, *, with_references: bool = False) -> list[EnvironmentRecord]:
        """The Environments this node owns. ``with_references`` also refreshes ``referenced_checkpoints``."""
        request = pb.InspectNodeRequest(node=self.node, session=self._session(), with_references=with_references)
        try:
            reply = await self.stub.InspectNode(request, timeout=self.rpc_timeout)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, "inspect node") from None
        self.retired_checkpoints = [CheckpointRef.model_validate_json(doc) for doc in reply.retired_checkpoint_json]
        if with_references:
            # None: this Coordinator did not say what is referenced, so nothing may be swept on its word.
            included = reply.references_included
            self.referenced_checkpoints = set(reply.referenced_checkpoint_ids) if included else None
        return [EnvironmentRecord.model_validate_json(doc) for doc in reply.environment_json]

    async def peers(self) -> dict[str, str]:
        """The cluster's other live nodes, name -> gRPC address (where an image may be pulled from)."""
        request = pb.InspectNodeRequest(node=self.node, session=self._session())
        try:
            reply = await self.stub.InspectNode(request, timeout=self.rpc_timeout)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, "inspect node") from None
        return {peer.name: peer.address for peer in reply.peers}

    async def confirm_checkpoint_deleted(self, checkpoint_id: str) -> None:
        request = pb.ConfirmCheckpointDeletedRequest(
            node=self.node, session=self._session(), checkpoint_id=checkpoint_id
        )
        try:
            await self.stub.ConfirmCheckpointDeleted(request, timeout=self.rpc_timeout)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, f"confirm deletion of checkpoint {checkpoint_id}") from None

    async def fetch(self, env_id: str) -> EnvironmentRecord | None:
        return next((record for record in await self.catalog() if record.id == env_id), None)


def wire_changes(record: EnvironmentRecord, changes: RecordChanges) -> dict[str, object]:
    """``changes`` (field names, model values) as the wire fields a commit carries (validated on the record)."""
    wire = EnvironmentRecord.model_validate({**record.model_dump(), **changes}).to_wire()
    fields = EnvironmentRecord.model_fields
    return {alias: wire[alias] for alias in (fields[name].alias or name for name in changes)}
