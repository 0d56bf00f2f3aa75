"""Fixtures for API/Ingress/SDK tests: a real Coordinator on a real Redis (conftest's ``coordinator_cluster``),
the real API server under uvicorn on a free port, tenants made through the Coordinator, nodes registered with
the node-facing RPCs (their admission address answers nothing, so Environments stay ``pending``)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import uvicorn

from adx._certs import Identity, component_paths, issue
from adx._grpc_tls import channel_credentials
from adx.api import ApiConfig, CoordinatorClient, create_app
from adx.model import EnvironmentRecord, IssuedKey, new_id
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc as pb_grpc

GiB = 2**30
STEP = 10.0  # every wait here is bounded


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class NodeHandle:
    name: str
    channel: Any
    stub: Any
    session: str


@dataclass
class ApiStack:
    cluster: Any  # conftest.CoordinatorCluster
    config: ApiConfig
    url: str
    server: uvicorn.Server
    task: asyncio.Task[None]
    keys: dict[str, str] = field(default_factory=dict)
    nodes: list[NodeHandle] = field(default_factory=list)

    async def tenant(self, name: str) -> str:
        """A new tenant's API key, made through the Coordinator as `adx tenant create` does."""
        client = CoordinatorClient.from_config(self.config)
        try:
            key = await client.create_tenant(name)
        finally:
            await client.close()
        self.keys[name] = key
        return key

    def http(self, key: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=STEP)

    async def register_node(
        self,
        name: str,
        *,
        cpu_millis: int = 64_000,
        memory_bytes: int = 256 * GiB,
        relay_address: str = "127.0.0.1:1",
        address: str = "127.0.0.1:1",
    ) -> NodeHandle:
        channel, stub = self.cluster.stub(name)
        session = new_id("ses")
        await stub.RegisterNode(
            pb.RegisterNodeRequest(node=name, session=session, address=address, relay_address=relay_address),
            timeout=STEP,
        )
        capacity = {"cpuMillis": cpu_millis, "memoryBytes": memory_bytes, "diskBytes": 1024 * GiB}
        await stub.ReportCapacity(
            pb.ReportCapacityRequest(
                node=name,
                session=session,
                capacity_json=json.dumps(capacity),
                valid_for_seconds=600,
                admission_open=True,
            ),
            timeout=STEP,
        )
        handle = NodeHandle(name, channel, stub, session)
        self.nodes.append(handle)
        return handle

    async def commit(self, node: NodeHandle, environment_id: str, changes: dict[str, Any]) -> EnvironmentRecord:
        """Commit a node result (as the node's Controller does) for an Environment that node owns."""
        current = self.cluster.coordinator.service.cache.environments[environment_id]
        reply = await node.stub.CommitResult(
            pb.CommitResultRequest(
                node=node.name,
                session=node.session,
                environment_id=environment_id,
                expected_revision=current.revision,
                expected_generation=current.generation,
                changes_json=json.dumps(changes),
            ),
            timeout=STEP,
        )
        return EnvironmentRecord.model_validate_json(reply.environment_json)

    async def mark_running(self, node: NodeHandle, environment_id: str) -> EnvironmentRecord:
        await self.commit(node, environment_id, {"state": "starting"})
        return await self.commit(node, environment_id, {"state": "running", "executionId": new_id("exe")})

    async def following(self) -> Any:
        """The API's Ingress, once it hears the Coordinator's route stream (its first event, the resync, came)."""
        from adx.ingress import serving_ingress

        ingress = serving_ingress(self.server.config.app)
        assert ingress is not None, "this API serves no data plane"
        deadline = time.monotonic() + STEP
        while not ingress.following:
            assert time.monotonic() < deadline, "the API never followed the route stream"
            await asyncio.sleep(0.01)
        return ingress

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.wait_for(self.task, STEP)
        for node in self.nodes:
            await node.channel.close()


def api_config(cluster: Any, **overrides: Any) -> ApiConfig:
    issue(cluster.certs, Identity("api", "main"))
    return ApiConfig(listen="127.0.0.1:0", coordinator=cluster.target, certs_dir=cluster.certs, **overrides)


async def start_api(cluster: Any, **overrides: Any) -> ApiStack:
    config = api_config(cluster, **overrides)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), lifespan="on", log_config=None, access_log=False, timeout_keep_alive=30)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    deadline = time.monotonic() + STEP
    while not server.started:
        assert not task.done(), "the API server did not start"
        assert time.monotonic() < deadline, "the API server did not start in time"
        await asyncio.sleep(0.01)
    return ApiStack(cluster, config, f"http://127.0.0.1:{port}", server, task)


@pytest.fixture
async def api_stack(
    coordinator_cluster: Callable[..., Awaitable[tuple[Any, Any]]],
) -> AsyncIterator[Callable[..., Awaitable[ApiStack]]]:
    """``await make(**ApiConfig overrides)`` -> a running ApiStack on a fresh Coordinator + Redis."""
    made: list[ApiStack] = []

    async def make(**overrides: Any) -> ApiStack:
        cluster, _ = await coordinator_cluster()
        stack = await start_api(cluster, **overrides)
        made.append(stack)
        return stack

    yield make
    for stack in made:
        await stack.stop()


@pytest.fixture
async def api_for() -> AsyncIterator[Callable[..., Awaitable[ApiStack]]]:
    """``await make(cluster, **overrides)`` -> the API server on an existing Coordinator (e.g. node_cluster's)."""
    made: list[ApiStack] = []

    async def make(cluster: Any, **overrides: Any) -> ApiStack:
        stack = await start_api(cluster, **overrides)
        made.append(stack)
        return stack

    yield make
    for stack in made:
        await stack.stop()


class ApiProcess:
    """``adx api`` as a real process (for the SIGKILL test and the CLI)."""

    def __init__(self, config_path: Path, log: Path) -> None:
        self.config_path = config_path
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, url: str) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "adx", "api", "--config", str(self.config_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"adx api did not answer: {self.log.read_text()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def write_api_config(path: Path, cluster: Any, port: int, **extra: Any) -> Path:
    issue(cluster.certs, Identity("api", "main"))
    lines = [
        f'listen = "127.0.0.1:{port}"',
        f'coordinator = "{cluster.target}"',
        f'certs_dir = "{cluster.certs}"',
        *(f"{key} = {json.dumps(value)}" for key, value in extra.items()),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


#: The `adx` command as a user runs it: a real subprocess of this interpreter.
ADX = [sys.executable, "-m", "adx"]


async def adx_cli(*args: str, env: dict[str, str] | None = None, limit: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *ADX,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), limit)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def as_user(stack: ApiStack, key: str) -> dict[str, str]:
    return {"ADX_API_URL": stack.url, "ADX_API_KEY": key, "XDG_CONFIG_HOME": "/nonexistent"}


async def admin_key(stack: ApiStack) -> str:
    """An admin key made through the Coordinator, as `adx up` makes it."""
    creds = channel_credentials(component_paths(stack.config.certs_dir, Identity("api", "main")))
    async with grpc.aio.secure_channel(stack.cluster.target, creds) as channel:
        reply = await pb_grpc.CoordinatorAdminStub(channel).CreateAdminKey(pb.CreateAdminKeyRequest(name="ops"))
    return IssuedKey.model_validate_json(reply.json).api_key
