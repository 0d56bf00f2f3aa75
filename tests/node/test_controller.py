"""The per-Environment Controller on real parts: a real sandboxd (execd as PID 1 of every sandbox) and a
real Coordinator on Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sbx_helpers import Daemon, DaemonFactory

from adx._fs import ShortUnixPath
from adx.coordinator import CoordinatorStore
from adx.model import EnvironmentRecord, EnvironmentSpec, EnvironmentState, Resources, new_id
from adx.node._controller import CheckpointPlaces, Controller, ControllerTimings
from adx.node._coordinator_client import CoordinatorSink
from adx.node._executions import ExecutionFiles
from adx.node._operations import Delete, Step
from adx.node._reporter import Reporter
from adx.node._resources import CapacityTracker
from adx.runtime import ExecutionState
from adx.runtime._sandboxd import ExecdReadiness, SandboxdDriver

GiB = 2**30


@pytest.fixture
def sandboxd(tmp_path: Path) -> Iterator[Daemon]:
    factory = DaemonFactory(tmp_path)
    try:
        yield factory("d1")
    finally:
        factory.cleanup()


@dataclass
class Node:
    driver: SandboxdDriver
    sink: CoordinatorSink
    store: CoordinatorStore
    cluster: Any
    executions: ExecutionFiles

    def controller(self, record: EnvironmentRecord) -> Controller:
        controller = Controller(
            record,
            driver=self.driver,
            sink=self.sink,
            executions=self.executions,
            readiness=ExecdReadiness(self.driver),
            timings=ControllerTimings(ready_timeout_seconds=30, retry_min_seconds=0.05, retry_max_seconds=0.5),
            places=CheckpointPlaces(node=record.node or ""),
        )
        controller.start_task()
        return controller

    async def new_environment(self, **spec: Any) -> EnvironmentRecord:
        return await placed_environment(self.store, self.cluster, **spec)


async def placed_environment(store: CoordinatorStore, cluster: Any, **spec: Any) -> EnvironmentRecord:
    """A pending Environment placed on n1, stored in Redis and in the Coordinator's cache (as a create does)."""
    now = time.time()
    record = EnvironmentRecord(
        id=new_id("env"),
        tenant="acme",
        spec=EnvironmentSpec(resources=Resources(cpu_millis=250, memory_bytes=256 * 2**20), **spec),
        state=EnvironmentState.PENDING,
        node="n1",
        generation=1,
        revision=1,
        created_at=now,
        updated_at=now,
    )
    created = (await store.create_environment(record)).record
    cluster.coordinator.service.cache.apply(created)
    return created


async def registered_reporter(stub: Any, node: str = "n1") -> Reporter:
    """The node's real Reporter, registered with the Coordinator behind ``stub`` (a first report)."""

    async def capacity() -> Resources:
        return Resources(cpu_millis=8000, memory_bytes=16 * GiB)

    reporter = Reporter(
        stub,
        node=node,
        address="127.0.0.1:1",
        relay_address="127.0.0.1:2",
        tracker=CapacityTracker(capacity, 60),
        interval=1,
        rpc_timeout=5,
    )
    await reporter.report_once()
    return reporter


@pytest.fixture
async def node(coordinator_cluster, sandboxd: Daemon, tmp_path: Path) -> AsyncIterator[Node]:
    cluster, _ = await coordinator_cluster()
    channel, stub = cluster.stub("n1")
    reporter = await registered_reporter(stub)
    driver = SandboxdDriver(sandboxd.socket)
    store = CoordinatorStore.from_url(cluster.config.redis_url)
    sink = CoordinatorSink(stub, "n1", lambda: reporter.state.session, rpc_timeout=5)
    yield Node(driver, sink, store, cluster, ExecutionFiles(tmp_path / "executions"))
    await driver.aclose()
    await store.close()
    await channel.close()


async def run_in_execd(socket: Path, argv: list[str]) -> tuple[str, int]:
    with ShortUnixPath(socket) as path:
        transport = httpx.AsyncHTTPTransport(uds=path)
        async with httpx.AsyncClient(transport=transport, base_url="http://execd", timeout=10) as client:
            response = await client.post("/v1/commands", json={"argv": argv})
            response.raise_for_status()
            frames = [json.loads(line) for line in response.text.splitlines() if line]
    stdout = "".join(f.get("data", "") for f in frames if f.get("stream") == "stdout")
    return stdout, frames[-1]["exitCode"]


async def test_start_run_a_command_then_delete_releases_everything(node: Node) -> None:
    record = await node.new_environment()
    controller = node.controller(record)
    running = await asyncio.wait_for(controller.submit(Step.START), 60)
    assert running.state is EnvironmentState.RUNNING and running.execution_id
    execution = controller.execution
    assert execution is not None and execution.execd_socket is not None
    assert await run_in_execd(execution.execd_socket, ["sh", "-c", "echo hello from $(hostname)"]) == (
        f"hello from {execution.execution_id}\n",
        0,
    )
    stored = await node.store.get_environment(record.id)
    assert (stored.state, stored.execution_id) == (EnvironmentState.RUNNING, execution.execution_id)
    assert (await node.store.get_node("n1")).reserved == record.spec.resources

    deleted = await asyncio.wait_for(controller.submit(Delete()), 60)
    assert deleted.state is EnvironmentState.DELETED
    assert await node.driver.observe(execution) in (ExecutionState.MISSING, ExecutionState.UNKNOWN)
    assert (await node.store.get_node("n1")).reserved == Resources()
    assert node.executions.load_all() == []


@pytest.mark.req("RST-1")
async def test_workload_exit_retires_cleans_up_then_fails(node: Node) -> None:
    record = await node.new_environment(entrypoint=["sh", "-c", "sleep 1; exit 3"])
    controller = node.controller(record)
    await asyncio.wait_for(controller.submit(Step.START), 60)
    execution = controller.execution
    assert execution is not None
    deadline = time.monotonic() + 30
    while controller.record.state is not EnvironmentState.FAILED:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert controller.record.last_error == "exited with status 3"
    # Cleanup was confirmed before Failed was committed: the sandbox is gone, the reservation released.
    assert await node.driver.observe(execution) in (ExecutionState.MISSING, ExecutionState.UNKNOWN)
    stored = await node.store.get_environment(record.id)
    assert stored.state is EnvironmentState.FAILED
    assert (await node.store.get_node("n1")).reserved == Resources()


@pytest.mark.req("RST-7")
async def test_a_failed_first_start_is_failed_at_once_and_releases(node: Node) -> None:
    record = await node.new_environment(entrypoint=["/does/not/exist"])
    controller = node.controller(record)
    failed = await asyncio.wait_for(controller.submit(Step.START), 60)
    assert failed.state is EnvironmentState.FAILED
    assert "start failed" in (failed.last_error or "")
    assert (await node.store.get_node("n1")).reserved == Resources()
    # It never becomes Running, and a second start is refused.
    with pytest.raises(Exception, match="not pending"):
        await controller.submit(Step.START)


@pytest.mark.req("RES-2")
async def test_sandboxd_resource_source_reads_the_resource_call_after_a_health_call(sandboxd: Daemon) -> None:
    """The node's ``sandboxd`` capacity source: CPU cores become millicores; a failing source keeps the sample."""
    from adx.config._node import NodeConfig
    from adx.node._agent import NodeAgent

    agent = NodeAgent(
        NodeConfig(
            name="n1",
            resource_source={"kind": "sandboxd", "socket": sandboxd.socket, "valid_for_seconds": 30},
            runtime={"socket": sandboxd.socket},
        )
    )
    try:
        tracker = agent._capacity_tracker()
        sample = await tracker.refresh()
        assert sample is not None
        async with sandboxd.client() as client:
            info = await client.resource()
        # What sandboxd admits against: its [capacity] (the test daemons configure 1000 CPUs), else the host's
        # memory and the state disk's size (not its free space, which moves with every write).
        assert sample.capacity.cpu_millis == info.capacity.cpu_millis == 1_000_000
        assert sample.capacity.memory_bytes == info.capacity.memory_bytes == info.memory_bytes
        assert sample.capacity.disk_bytes == info.capacity.disk_bytes == info.storage_bytes
        sandboxd.kill()  # the source fails: the previous sample stays (RES-6), nothing is invented
        again = await tracker.refresh()
        assert again == sample and tracker.last_error
    finally:
        await agent.driver.aclose()
