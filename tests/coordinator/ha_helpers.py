"""Real Coordinator replicas as ``adx coordinator --config FILE`` processes (so they can be SIGKILLed and
SIGSTOPped), the failover-aware client on them, and an admitting node endpoint for placement.

The node endpoint is a real gRPC server with the node's certificate that answers ``AdmitEnvironment`` by
keeping the record (it stays Pending there) and counts every hand-over: the Coordinator's failover is under
test here, not the adxlet, and the count shows that no Environment was handed over twice or to another node.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from daemon_process import DaemonProcess

from adx._certs import Identity, init_ca, issue
from adx._coordinator_channel import FailoverChannel, coordinator_channel
from adx._grpc_tls import channel_credentials, server_credentials
from adx.embedded._adx_daemons import render_toml
from adx.embedded._process import pick_free_port
from adx.model import EnvironmentRecord, Resources, new_id
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc, health_pb2, health_pb2_grpc, node_pb2, node_pb2_grpc


class ReplicaProcess(DaemonProcess):
    """``adx coordinator --config`` as a real process, with its address."""

    def __init__(self, name: str, config: dict[str, object], directory: Path) -> None:
        self.name = name
        self.port = int(str(config["listen"]).rpartition(":")[2])
        self.target = f"localhost:{self.port}"
        config_path = directory / f"{name}.toml"
        config_path.write_text(render_toml(config))
        super().__init__("coordinator", config_path, directory / f"{name}.log")


class AdmittingNode(node_pb2_grpc.NodeServicer):
    """A node's gRPC endpoint that takes every Environment handed to it (and remembers each hand-over)."""

    def __init__(self) -> None:
        self.admitted: Counter[str] = Counter()
        self.owner: dict[str, str] = {}

    async def AdmitEnvironment(
        self, request: node_pb2.AdmitEnvironmentRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> node_pb2.AdmitEnvironmentResponse:
        record = EnvironmentRecord.model_validate_json(request.environment_json)
        self.admitted[record.id] += 1
        self.owner[record.id] = record.node or ""
        return node_pb2.AdmitEnvironmentResponse(environment_json=request.environment_json)


@dataclass
class HaCluster:
    certs: Path
    redis_url: str
    replicas: list[ReplicaProcess]
    nodes: dict[str, AdmittingNode] = field(default_factory=dict)
    node_servers: list[grpc.aio.Server] = field(default_factory=list)
    channels: list[FailoverChannel] = field(default_factory=list)

    @property
    def targets(self) -> list[str]:
        return [replica.target for replica in self.replicas]

    def channel(self, identity: Identity = Identity("api", "main"), **kwargs: Any) -> FailoverChannel:
        channel = coordinator_channel(self.targets, channel_credentials(issue(self.certs, identity)), **kwargs)
        self.channels.append(channel)
        return channel

    def api(self, **kwargs: Any) -> Any:
        return coordinator_pb2_grpc.CoordinatorStub(self.channel(**kwargs))

    async def wait_active(self, replica: ReplicaProcess, within: float = 30.0) -> float:
        """Until ``replica`` answers Health SERVING on its own address; returns when (monotonic)."""
        credentials = channel_credentials(issue(self.certs, Identity("api", "main")))
        deadline = time.monotonic() + within
        async with grpc.aio.secure_channel(replica.target, credentials) as channel:
            while True:
                try:
                    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.monotonic()
                except grpc.aio.AioRpcError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"{replica.name} never became active:\n{replica.log_text()[-3000:]}")
                await asyncio.sleep(0.05)

    async def add_node(self, name: str) -> None:
        """Register node ``name`` (with an admitting endpoint) and give it capacity for the whole test."""
        paths = issue(self.certs, Identity("node", name))
        servicer = AdmittingNode()
        server = grpc.aio.server()
        node_pb2_grpc.add_NodeServicer_to_server(servicer, server)
        port = server.add_secure_port("127.0.0.1:0", server_credentials(paths))
        await server.start()
        self.node_servers.append(server)
        self.nodes[name] = servicer
        stub = coordinator_pb2_grpc.CoordinatorStub(self.channel(Identity("node", name)))
        session = new_id("ses")
        await stub.RegisterNode(
            pb.RegisterNodeRequest(node=name, session=session, address=f"localhost:{port}"), timeout=30
        )
        capacity = Resources(cpu_millis=10**6, memory_bytes=2**50, disk_bytes=0)
        await stub.ReportCapacity(
            pb.ReportCapacityRequest(
                node=name,
                session=session,
                capacity_json=capacity.model_dump_json(by_alias=True),
                valid_for_seconds=3600,
                admission_open=True,
            ),
            timeout=30,
        )

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
        for server in self.node_servers:
            await server.stop(None)
        for replica in self.replicas:
            replica.stop()


def make_cluster(
    tmp_path: Path, redis_url: str, replicas: int = 2, lease_seconds: float = 2.0, **extra: object
) -> HaCluster:
    certs = tmp_path / "certs"
    if not (certs / "ca.pem").exists():
        init_ca(certs)
    issue(certs, Identity("coordinator", "main"))
    made = []
    for index in range(replicas):
        config: dict[str, object] = {
            "listen": f"127.0.0.1:{pick_free_port('127.0.0.1')}",
            "redis_url": redis_url,
            "certs_dir": str(certs),
            "session_ttl_seconds": 3600,
            "leader_lease_seconds": lease_seconds,
            "redis_timeout_seconds": 2,
            **extra,
        }
        made.append(ReplicaProcess(f"coordinator-{'ab'[index] if index < 2 else index}", config, tmp_path))
    return HaCluster(certs, redis_url, made)
