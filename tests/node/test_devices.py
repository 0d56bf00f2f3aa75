"""Whole-device IDs (RES-2, RES-8) from the resource source to the Coordinator's NodeRecord, on real parts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_pressure import wait_node

from adx.coordinator import CoordinatorStore
from adx.model import Resources
from adx.node._reporter import Reporter
from adx.node._resources import CapacityTracker, read_capacity_file_devices

GiB = 2**30


@pytest.mark.req("RES-2", "RES-8")
async def test_sandboxd_device_ids_reach_the_node_record(node_cluster, tmp_path: Path) -> None:
    devices_file = tmp_path / "devices.json"
    devices_file.write_text(json.dumps(["npu0"]))
    nc: Any = await node_cluster(
        sandboxd_resources=True,
        sandboxd_config={"devices": ["gpu0", "gpu1"], "devices_file": str(devices_file)},
    )
    node = await wait_node(nc, lambda n: n.devices == ["gpu0", "gpu1", "npu0"])
    # The rest of the sample is sandboxd's admission capacity (RES-2; the test daemons configure 1000 CPUs, memory
    # is the host's), and nothing is invented.
    info = await nc.sandboxds["n1"].client().resource()
    assert node.capacity.cpu_millis == info.capacity.cpu_millis == 1_000_000
    assert node.capacity.memory_bytes == info.capacity.memory_bytes == info.memory_bytes
    # The inventory changes on the host: the next reports carry it.
    devices_file.write_text(json.dumps(["npu0", "npu1"]))
    node = await wait_node(nc, lambda n: n.devices == ["gpu0", "gpu1", "npu0", "npu1"])
    assert node.admission_open


@pytest.mark.req("RES-8")
async def test_a_capacity_file_may_list_devices(coordinator_cluster, tmp_path: Path) -> None:
    cluster, _ = await coordinator_cluster()
    channel, stub = cluster.stub("n1")
    path = tmp_path / "cap.json"
    path.write_text(json.dumps({"cpuMillis": 2000, "memoryBytes": 4 * GiB, "devices": ["gpu0", "gpu0", "gpu1"]}))

    async def read() -> Any:
        return await asyncio.to_thread(read_capacity_file_devices, path)

    reporter = Reporter(
        stub,
        node="n1",
        address="127.0.0.1:1",
        relay_address="127.0.0.1:2",
        tracker=CapacityTracker(read, 30.0),
        interval=0.2,
        rpc_timeout=5,
    )
    store = CoordinatorStore.from_url(cluster.config.redis_url)
    try:
        await reporter.report_once()
        node = await store.get_node("n1")
        assert node.devices == ["gpu0", "gpu1"]
        assert node.capacity == Resources(cpu_millis=2000, memory_bytes=4 * GiB)
        # A malformed device list is a failed read (the old sample stays), never "no devices".
        path.write_text(json.dumps({"cpuMillis": 2000, "devices": "gpu0"}))
        await reporter.report_once()
        assert reporter.tracker.last_error is not None and "devices must be a list" in reporter.tracker.last_error
        assert (await store.get_node("n1")).devices == ["gpu0", "gpu1"]
    finally:
        await store.close()
        await channel.close()
