"""The adxlet end to end on real parts: Coordinator + Redis, adxlet, sandboxd, execd, Relay (mTLS)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import grpc
import httpx
import pytest

from adx._certs import client_ssl_context
from adx._grpc_errors import from_rpc_error
from adx.errors import UnavailableError, UncertainOutcomeError
from adx.model import EnvironmentRecord, EnvironmentState, Resources
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc as pb_grpc

GiB = 2**30


class Api:
    """The Coordinator's API-facing calls, as the API server makes them (api certificate)."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.channel = grpc.aio.secure_channel(nc.cluster.target, nc.api_credentials())
        self.stub = pb_grpc.CoordinatorStub(self.channel)

    async def call(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, what) from None

    async def create(self, tenant: str = "acme", **spec: Any) -> EnvironmentRecord:
        body = {"resources": {"cpuMillis": 250, "memoryBytes": 256 * 2**20}, **spec}
        reply = await self.call(
            "create",
            self.stub.CreateEnvironment(pb.CreateEnvironmentRequest(tenant=tenant, spec_json=json.dumps(body))),
        )
        return EnvironmentRecord.model_validate_json(reply.environment_json)

    async def get(self, env_id: str, tenant: str = "acme") -> EnvironmentRecord:
        reply = await self.call(
            "get", self.stub.GetEnvironment(pb.EnvironmentRequest(tenant=tenant, environment_id=env_id))
        )
        return EnvironmentRecord.model_validate_json(reply.environment_json)

    async def delete(self, env_id: str, tenant: str = "acme") -> EnvironmentRecord:
        reply = await self.call(
            "delete", self.stub.DeleteEnvironment(pb.EnvironmentRequest(tenant=tenant, environment_id=env_id))
        )
        return EnvironmentRecord.model_validate_json(reply.environment_json)

    async def route(self, env_id: str, tenant: str = "acme") -> str:
        reply = await self.call(
            "route", self.stub.ResolveRoute(pb.EnvironmentRequest(tenant=tenant, environment_id=env_id))
        )
        return str(reply.relay_address)

    async def wait_state(self, env_id: str, state: EnvironmentState, within: float = 30) -> EnvironmentRecord:
        deadline = time.monotonic() + within
        while True:
            try:
                record = await self.get(env_id)
            except (UnavailableError, UncertainOutcomeError) as exc:  # a Coordinator restarting its term
                assert time.monotonic() < deadline, f"{env_id}: the Coordinator did not answer: {exc}"
                await asyncio.sleep(0.2)
                continue
            if record.state is state:
                return record
            assert time.monotonic() < deadline, f"{env_id} is {record.state.value}, expected {state.value}"
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self.channel.close(None)


def relay_client(nc: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=client_ssl_context(nc.api_cert_paths()), timeout=30)


async def run_via_relay(nc: Any, relay: str, env_id: str, argv: list[str]) -> tuple[str, int]:
    async with relay_client(nc) as client:
        response = await client.post(
            f"https://{relay.replace('127.0.0.1', 'localhost')}/{env_id}/v1/commands", json={"argv": argv}
        )
        assert response.status_code == 200, response.text
        frames = [json.loads(line) for line in response.text.splitlines() if line]
    return "".join(f.get("data", "") for f in frames if f.get("stream") == "stdout"), frames[-1]["exitCode"]


async def test_create_run_delete_through_coordinator_node_and_relay(node_cluster) -> None:
    nc = await node_cluster()
    api = Api(nc)
    try:
        created = await api.create()
        assert (created.node, created.generation) == ("n1", 1)
        running = await api.wait_state(created.id, EnvironmentState.RUNNING)
        relay = await api.route(created.id)
        assert await run_via_relay(nc, relay, created.id, ["sh", "-c", "echo $((6*7))"]) == ("42\n", 0)

        await api.delete(created.id)
        await api.wait_state(created.id, EnvironmentState.DELETED)
        agent = nc.nodes["n1"]
        assert created.id not in agent.controllers or agent.controllers[created.id].state is EnvironmentState.DELETED
        sandboxes = await agent.driver.client.list()
        assert running.execution_id not in {s.sandbox_id for s in sandboxes}
        async with relay_client(nc) as client:
            gone = await client.post(
                f"https://{relay.replace('127.0.0.1', 'localhost')}/{created.id}/v1/commands", json={"argv": ["true"]}
            )
        assert gone.status_code in (404, 409)
    finally:
        await api.close()


@pytest.mark.req("NOD-1")
async def test_a_restarted_node_adopts_its_running_environment(node_cluster) -> None:
    nc = await node_cluster()
    api = Api(nc)
    try:
        created = await api.create()
        running = await api.wait_state(created.id, EnvironmentState.RUNNING)
        agent = nc.nodes["n1"]
        await agent.stop()
        from adx.node._agent import NodeAgent

        successor = NodeAgent(agent.config)
        await successor.start()
        nc.nodes["n1"] = successor
        try:
            assert successor.controllers[created.id].state is EnvironmentState.RUNNING
            same = await api.get(created.id)
            assert (same.execution_id, same.revision) == (running.execution_id, running.revision)
            relay = await api.route(created.id)
            assert await run_via_relay(nc, relay, created.id, ["echo", "still here"]) == ("still here\n", 0)
        finally:
            await successor.stop()
    finally:
        await api.close()


@pytest.mark.req("RES-4", "RES-6")
async def test_placement_follows_capacity_across_two_nodes(node_cluster) -> None:
    nc = await node_cluster(nodes=("n1", "n2"), capacity={"cpuMillis": 1000, "memoryBytes": 4 * GiB})
    api = Api(nc)
    try:
        placed = [await api.create(resources={"cpuMillis": 400, "memoryBytes": GiB}) for _ in range(4)]
        assert sorted(r.node or "" for r in placed) == ["n1", "n1", "n2", "n2"]
        with pytest.raises(Exception, match="no node can take"):
            await api.create(resources={"cpuMillis": 400, "memoryBytes": GiB})
        for record in placed:
            await api.wait_state(record.id, EnvironmentState.RUNNING)
        stores = nc.cluster.coordinator.store
        assert (await stores.get_node("n1")).reserved == Resources(cpu_millis=800, memory_bytes=2 * GiB)
    finally:
        await api.close()


@pytest.mark.req("RES-4", "RES-6")
async def test_zero_capacity_and_expired_samples_get_nothing(node_cluster, tmp_path) -> None:
    nc = await node_cluster(
        nodes=("n1", "n2"), capacity={"cpuMillis": 4000, "memoryBytes": 8 * GiB}, capacity_valid_for=3.0
    )
    api = Api(nc)
    try:
        # n2 reports a zero sample: still registered and fresh, but no positive request fits it.
        (tmp_path / "n2-capacity.json").write_text(json.dumps({"cpuMillis": 0, "memoryBytes": 0}))
        await asyncio.sleep(1.2)
        placed = [await api.create() for _ in range(3)]
        assert {r.node for r in placed} == {"n1"}
        # n1's source fails: its sample is kept until its own validity ends, then n1 gets nothing either.
        (tmp_path / "n1-capacity.json").unlink()
        n1 = nc.nodes["n1"]
        deadline = time.monotonic() + n1.reporter.tracker.valid_for + 5
        while n1.reporter.tracker.fresh():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.2)
        with pytest.raises(Exception, match="no node can take") as refused:
            await api.create()
        assert "n1: node capacity sample expired" in str(refused.value) or "n1: node admission closed" in str(
            refused.value
        )
        # The running Environments are untouched (RES-5).
        for record in placed:
            assert (await api.get(record.id)).state in (EnvironmentState.RUNNING, EnvironmentState.STARTING)
    finally:
        await api.close()


@pytest.mark.req("NOD-3")
async def test_routine_check_starts_a_pending_environment_the_node_never_heard_of(node_cluster) -> None:
    """The Coordinator placed it but its admit call never reached the node: the catalog converges it."""
    nc = await node_cluster()
    api = Api(nc)
    try:
        creator = nc.cluster.coordinator.service.creator
        nodes, creator.nodes = creator.nodes, None  # the admit call is lost on the way
        try:
            created = await api.create()
        finally:
            creator.nodes = nodes
        assert created.state is EnvironmentState.PENDING
        assert created.id not in nc.nodes["n1"].controllers
        running = await api.wait_state(created.id, EnvironmentState.RUNNING)
        assert running.execution_id
    finally:
        await api.close()


@pytest.mark.req("NOD-19", "ENV-3")
async def test_a_shared_root_the_runtime_lacks_stops_the_start_naming_the_setting(node_cluster) -> None:
    """checkpoints.shared_root names a sandboxd storage; a name sandboxd does not have is a configuration error
    that stops the adxlet at once, before it registers or serves anything."""
    from adx.errors import InvalidInputError
    from adx.node._agent import NodeAgent

    nc = await node_cluster()
    agent = nc.nodes["n1"]
    await agent.stop()
    config = agent.config.model_copy(
        update={"checkpoints": agent.config.checkpoints.model_copy(update={"shared_root": "nfs"})}
    )
    with pytest.raises(
        InvalidInputError, match=r"checkpoints.shared_root: the runtime has no checkpoint storage 'nfs'"
    ):
        await NodeAgent(config).start()


async def test_the_relay_keeps_an_idle_connection_longer_than_its_clients_do(node_cluster) -> None:
    """The Ingress keeps idle connections to a Relay for 30 s; the Relay must not close them first, or the next
    request races the close ("Server disconnected without sending a response", seen in CI after a pause and
    resume left the connection idle past uvicorn's default 5 s). A real TLS connection idles 6 s and stays."""
    import ssl

    from adx._certs import client_ssl_context
    from adx.node._relay import RELAY_KEEP_ALIVE_SECONDS

    assert RELAY_KEEP_ALIVE_SECONDS > 30
    nc = await node_cluster()
    agent = nc.nodes["n1"]
    host, _, port = agent.reporter.relay_address.rpartition(":")
    context: ssl.SSLContext = client_ssl_context(nc.api_cert_paths())
    reader, writer = await asyncio.open_connection(host, int(port), ssl=context, server_hostname="localhost")
    try:
        writer.write(b"GET /env-nothing/v1/health HTTP/1.1\r\nhost: localhost\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        await reader.readexactly(length)
        await asyncio.sleep(6.0)
        writer.write(b"GET /env-nothing/v1/health HTTP/1.1\r\nhost: localhost\r\n\r\n")
        await writer.drain()
        again = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert again.startswith(b"HTTP/1.1 "), again
    except (OSError, asyncio.IncompleteReadError, ConnectionError) as exc:
        raise AssertionError(f"the Relay closed an idle connection after 6 s: {exc!r}") from None
    finally:
        writer.close()


async def test_a_stop_is_bounded_when_a_loop_does_not_end(node_cluster, caplog, monkeypatch) -> None:
    """A node loop that ignores its cancellation (fault injected: a task that swallows CancelledError) must not
    hang the node's stop: the stop ends within its bound, stops the servers, and names what was left behind
    (fresh-ci saw a node cluster's teardown hang until pytest-timeout's 300 s in an idle event loop)."""
    import adx.node._agent as agent_module

    monkeypatch.setattr(agent_module, "STOP_SECONDS", 1.0)
    caplog.set_level(logging.ERROR, logger=agent_module.log.name)
    nc = await node_cluster()
    agent = nc.nodes["n1"]
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                continue  # the fault: cancellation ignored

    task = asyncio.create_task(stubborn(), name="stubborn-loop")
    await asyncio.sleep(0.1)  # inside its try: a task cancelled before its first step just ends
    agent._tasks.append(task)
    started = time.monotonic()
    await agent.stop()
    took = time.monotonic() - started
    assert took < 8.0, took
    assert not task.done()  # left behind, not waited for
    assert any("stubborn-loop did not end" in r.getMessage() for r in caplog.records), caplog.text
    release.set()
    task.cancel()
