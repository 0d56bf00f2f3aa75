"""Node capacity sources (RES-1..3), sample freshness (RES-6) and the report loop (NOD-2) against a real
Coordinator."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from adx.config import ConfigError, load_model
from adx.config._node import AutoResourceSource, NodeConfig
from adx.coordinator import CoordinatorStore, NoCapacity
from adx.errors import UnavailableError
from adx.model import EnvironmentRecord, EnvironmentSpec, EnvironmentState, Resources, new_id
from adx.node._reporter import Reporter
from adx.node._resources import (
    CapacityTracker,
    cpu_limit_millis,
    memory_limit_bytes,
    read_auto,
    read_capacity_file,
)

GiB = 2**30


@pytest.mark.req("RES-1")
def test_resource_source_and_capacity_file_are_exclusive(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('name = "n1"\ncapacity_file = "/etc/cap.json"\n[resource_source]\nkind = "auto"\n')
    with pytest.raises(ConfigError, match="mutually exclusive"):
        load_model(NodeConfig, "node", path, environ={})
    path.write_text('name = "n1"\n[resource_source]\nkind = "sandboxd"\n')
    with pytest.raises(ConfigError) as caught:
        load_model(NodeConfig, "node", path, environ={})
    assert caught.value.field == "resource_source.sandboxd.socket"
    path.write_text('name = "n1"\n')
    assert isinstance(load_model(NodeConfig, "node", path, environ={}).effective_resource_source, AutoResourceSource)


@pytest.mark.req("RES-3")
def test_auto_reads_cgroup_aware_cpu_memory_and_disk(tmp_path: Path) -> None:
    sample = read_auto(tmp_path)
    assert sample.cpu_millis == min(len(os.sched_getaffinity(0)) * 1000, cpu_limit_millis())
    assert 0 < sample.cpu_millis <= (os.cpu_count() or 1) * 1000
    meminfo = Path("/proc/meminfo").read_text()
    total = next(int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemTotal:"))
    assert 0 < sample.memory_bytes <= total
    stat = os.statvfs(tmp_path)
    assert abs(sample.disk_bytes - stat.f_bavail * stat.f_frsize) < 256 * 2**20
    assert set(Resources.model_fields) == {"cpu_millis", "memory_bytes", "disk_bytes"}  # never invents devices


@pytest.mark.req("RES-3")
def test_cgroup_limits_are_hierarchical_and_tightest_wins(tmp_path: Path) -> None:
    """A fake-free check of the parsing: a real cgroupfs-shaped tree written by the test."""
    root = tmp_path / "cg"
    (root / "memory" / "a" / "b").mkdir(parents=True)
    (root / "memory" / "a" / "memory.limit_in_bytes").write_text(str(3 * GiB))
    (root / "memory" / "a" / "b" / "memory.limit_in_bytes").write_text(str(9223372036854771712))
    (root / "cpu" / "a" / "b").mkdir(parents=True)
    (root / "cpu" / "a" / "cpu.cfs_quota_us").write_text("150000")
    (root / "cpu" / "a" / "cpu.cfs_period_us").write_text("100000")
    (root / "cpu" / "a" / "b" / "cpu.cfs_quota_us").write_text("-1")
    (root / "cpu" / "a" / "b" / "cpu.cfs_period_us").write_text("100000")
    proc = "4:memory:/a/b\n1:cpu:/a/b\n0::/\n"
    assert memory_limit_bytes(root, proc) == 3 * GiB
    assert cpu_limit_millis(root, proc) == min(1500, len(os.sched_getaffinity(0)) * 1000)
    v2 = tmp_path / "v2"
    (v2 / "x").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory")
    (v2 / "x" / "cpu.max").write_text("50000 100000")
    (v2 / "x" / "memory.max").write_text(str(GiB))
    assert cpu_limit_millis(v2, "0::/x\n") == 500
    assert memory_limit_bytes(v2, "0::/x\n") == GiB


def test_capacity_file_errors_are_unavailable_not_zero(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError, match="not found"):
        read_capacity_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(UnavailableError, match="unreadable"):
        read_capacity_file(tmp_path / "bad.json")


def file_tracker(path: Path, valid_for: float) -> CapacityTracker:
    async def read() -> Resources:
        return read_capacity_file(path)

    return CapacityTracker(read, valid_for)


@pytest.mark.req("RES-6")
async def test_tracker_waits_for_a_first_sample_and_never_renews_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "cap.json"
    tracker = file_tracker(path, valid_for=10)
    assert await tracker.refresh(now=100) is None
    assert not tracker.fresh(100) and not tracker.admission_open(100)
    path.write_text(json.dumps({"cpuMillis": 0, "memoryBytes": 0, "diskBytes": 0}))
    sample = await tracker.refresh(now=101)
    assert sample is not None and sample.valid_until == 111
    # A fresh zero sample: fresh and open, but no positive request fits it.
    assert tracker.fresh(105) and tracker.admission_open(105)
    path.unlink()
    again = await tracker.refresh(now=109)
    assert again == sample and tracker.last_error
    assert tracker.fresh(111) and not tracker.fresh(111.01)
    assert not tracker.admission_open(112)
    tracker.pressure_closed = True
    path.write_text(json.dumps({"cpuMillis": 1000, "memoryBytes": GiB}))
    await tracker.refresh(now=120)
    assert tracker.fresh(120) and not tracker.admission_open(120)


def record(node: str) -> EnvironmentRecord:
    now = time.time()
    return EnvironmentRecord(
        id=new_id("env"),
        tenant="acme",
        spec=EnvironmentSpec(resources=Resources(cpu_millis=100, memory_bytes=GiB // 4)),
        state=EnvironmentState.PENDING,
        node=node,
        generation=1,
        revision=1,
        created_at=now,
        updated_at=now,
    )


@pytest.mark.req("NOD-2", "RES-6")
async def test_reports_keep_the_old_sample_until_its_validity_ends(coordinator_cluster, tmp_path: Path) -> None:
    cluster, _ = await coordinator_cluster()
    channel, stub = cluster.stub("n1")
    path = tmp_path / "cap.json"
    path.write_text(json.dumps({"cpuMillis": 2000, "memoryBytes": 4 * GiB}))
    reporter = Reporter(
        stub,
        node="n1",
        address="127.0.0.1:1",
        relay_address="127.0.0.1:2",
        tracker=file_tracker(path, valid_for=1.0),
        interval=0.2,
        rpc_timeout=5,
    )
    store = CoordinatorStore.from_url(cluster.config.redis_url)
    try:
        await reporter.report_once()
        assert reporter.admission_open
        node = await store.get_node("n1")
        assert node.capacity == Resources(cpu_millis=2000, memory_bytes=4 * GiB)
        assert node.admission_open and node.session == reporter.state.session
        first_validity = node.capacity_valid_until
        await store.create_environment(record("n1"))

        # The source fails: the old sample is reported with its original validity, never renewed.
        path.unlink()
        await asyncio.sleep(0.3)
        await reporter.report_once()
        node = await store.get_node("n1")
        assert abs(node.capacity_valid_until - first_validity) < 0.05
        await store.create_environment(record("n1"))  # still valid: placement works

        await asyncio.sleep(1.0)
        await reporter.report_once()
        assert not reporter.admission_open
        with pytest.raises(NoCapacity, match=r"sample expired|admission closed"):
            await store.create_environment(record("n1"))
        # Running reservations are untouched by the expiry (RES-5/6).
        assert (await store.get_node("n1")).reserved == Resources(cpu_millis=200, memory_bytes=GiB // 2)
    finally:
        await store.close()
        await channel.close()


@pytest.mark.req("NOD-6")
async def test_a_rejected_session_registers_again_and_unreachable_closes_admission(
    coordinator_cluster, tmp_path: Path
) -> None:
    cluster, _ = await coordinator_cluster()
    channel, stub = cluster.stub("n1")
    path = tmp_path / "cap.json"
    path.write_text(json.dumps({"cpuMillis": 2000, "memoryBytes": 4 * GiB}))
    reporter = Reporter(
        stub, node="n1", address="a:1", relay_address="a:2", tracker=file_tracker(path, 30), interval=1, rpc_timeout=2
    )
    await reporter.report_once()
    first = reporter.state.session
    # Another process of the same node took over: our session is rejected, we register anew.
    store = CoordinatorStore.from_url(cluster.config.redis_url)
    await store.register_node("n1", session=new_id("ses"), address="a:1")
    await cluster.coordinator.service._refresh_node("n1")
    await reporter.report_once()
    assert not reporter.state.registered and "session" in reporter.state.last_error
    await reporter.report_once()
    assert reporter.state.registered and reporter.state.session != first
    # A new handshake alone does not reopen admission: the node's barrier (drain, catalog, runtime recovery)
    # has to run first, and says so.
    assert reporter.state.retake_pending and not reporter.admission_open
    reporter.retaken()
    assert reporter.admission_open
    await store.close()

    await cluster.coordinator.stop(grace=None)
    await reporter.report_once()
    assert not reporter.state.coordinator_reachable
    assert not reporter.admission_open  # transport failure closes admission of new Environments
    await channel.close()
