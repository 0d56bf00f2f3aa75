"""Pressure admission (RES-7) on real parts: a Coordinator on Redis, an adxlet with its sandboxd, Relay.

Disk pressure is measured on a small tmpfs the test mounts and fills with real files; memory from a
meminfo-format file the node is configured to read (``pressure.meminfo_path``), which the test rewrites.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_node_agent import Api, run_via_relay

from adx.config import ConfigError, load_model
from adx.config._node import NodeConfig
from adx.coordinator import CoordinatorStore
from adx.errors import UnavailableError
from adx.model import EnvironmentRecord, EnvironmentState, NodeRecord
from adx.node._pressure import read_disk_used

MiB = 2**20


def meminfo(total_kib: int, available_kib: int) -> str:
    return f"MemTotal:       {total_kib} kB\nMemFree:        {available_kib} kB\nMemAvailable:   {available_kib} kB\n"


@pytest.fixture
async def small_fs(tmp_path: Path) -> AsyncIterator[Path]:
    """A real 256 MiB tmpfs: ``state/`` becomes sandboxd's state directory (``on_state_dir``), ``ballast/`` is
    where the test writes files that fill it, as other data on the same disk would.

    Requested before ``node_cluster`` so it is torn down after the daemons stop."""
    mount = tmp_path / "fs"
    mount.mkdir()
    await asyncio.to_thread(
        subprocess.run, ["mount", "-t", "tmpfs", "-o", "size=256m", "adx-pressure", str(mount)], check=True
    )
    (mount / "state").mkdir()
    (mount / "ballast").mkdir()
    yield mount
    state = tmp_path / "sandboxd" / "n1"
    await asyncio.to_thread(subprocess.run, ["umount", "--lazy", str(state)], check=False)
    await asyncio.to_thread(subprocess.run, ["umount", "--lazy", str(mount)], check=False)


async def on_state_dir(fs: Path, tmp_path: Path) -> None:
    """Bind ``fs/state`` where the node_cluster fixture's sandboxd n1 keeps its state (tmp_path/sandboxd/n1)."""
    state = tmp_path / "sandboxd" / "n1"
    state.mkdir()
    await asyncio.to_thread(subprocess.run, ["mount", "--bind", str(fs / "state"), str(state)], check=True)


def fill_to(fs: Path, name: str, fraction: float) -> None:
    """Write real data into ``fs/ballast/name`` until the filesystem is ``fraction`` full (plus 1 MiB)."""
    st = os.statvfs(fs)
    used = st.f_blocks - st.f_bfree
    target = int(fraction * (used + st.f_bavail))
    if target > used:
        fill(fs / "ballast", name, (target - used) * st.f_frsize // MiB + 1)


def fill(fs: Path, name: str, mib: int) -> None:
    with open(fs / name, "wb") as f:
        f.write(os.urandom(mib * MiB))  # tmpfs counts written pages: real data, no sparse holes


async def node_record(nc: Any, name: str = "n1") -> NodeRecord:
    store = CoordinatorStore.from_url(nc.cluster.config.redis_url)
    try:
        return await store.get_node(name)
    finally:
        await store.close()


async def wait_node(nc: Any, pred: Any, within: float = 15.0) -> NodeRecord:
    deadline = time.monotonic() + within
    while True:
        node = await node_record(nc)
        if pred(node):
            return node
        assert time.monotonic() < deadline, f"node record never matched: {node}"
        await asyncio.sleep(0.1)


@pytest.mark.req("RES-7")
def test_pressure_thresholds_are_typed_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('name = "n1"\n[pressure]\ndisk_high = 0.5\ndisk_low = 0.7\n')
    with pytest.raises(ConfigError, match="disk_low must not exceed disk_high"):
        load_model(NodeConfig, "node", path, environ={})
    path.write_text('name = "n1"\n[pressure]\nmemory_high = 1.5\n')
    with pytest.raises(ConfigError) as caught:
        load_model(NodeConfig, "node", path, environ={})
    assert caught.value.field == "pressure.memory_high"
    path.write_text('name = "n1"\n')
    defaults = load_model(NodeConfig, "node", path, environ={})
    assert (defaults.pressure.memory_high, defaults.pressure.memory_low) == (0.95, 0.90)
    assert (defaults.pressure.disk_high, defaults.pressure.disk_low) == (0.90, 0.85)
    assert defaults.pressure.disk_path is None  # sandboxd's state directory


@pytest.mark.req("RES-7", "RES-5")
async def test_disk_and_memory_pressure_close_and_reopen_admission(
    small_fs: Path, node_cluster, tmp_path: Path
) -> None:
    """Disk pressure on the filesystem holding sandboxd's state directory (no ``disk_path`` configured)."""
    await on_state_dir(small_fs, tmp_path)
    mem = tmp_path / "meminfo"
    mem.write_text(meminfo(16_000_000, 12_000_000))  # 25% in use
    nc = await node_cluster(
        node_config={
            "pressure": {
                "disk_high": 0.5,
                "disk_low": 0.3,
                "memory_high": 0.9,
                "memory_low": 0.8,
                "meminfo_path": mem,
            }
        },
        # sandboxd's own free-storage check would refuse its 1 GiB default disk on this small filesystem.
        sandboxd_config={"defaults": {"disk_bytes": 16 * MiB}},
    )
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        running = await api.create()
        await api.wait_state(running.id, EnvironmentState.RUNNING)
        relay = await api.route(running.id)
        await wait_node(nc, lambda n: n.admission_open and n.admission_reason == "")

        # Disk at its high mark (sandboxd's state directory's filesystem >= 50% used): admission closes, with
        # the reason on the NodeRecord.
        assert agent.reporter.pressure.gate.last.disk_used < 0.3
        await asyncio.to_thread(fill_to, small_fs, "a", 0.35)
        await asyncio.to_thread(fill_to, small_fs, "b", 0.5)
        assert read_disk_used(nc.sandboxds["n1"].state_dir) >= 0.5
        node = await wait_node(nc, lambda n: not n.admission_open)
        assert "disk" in node.admission_reason and ">= high 50%" in node.admission_reason
        with pytest.raises(Exception, match="no node can take") as refused:
            await api.create()
        assert "n1: node admission closed (pressure: disk" in str(refused.value)
        # The node itself refuses an admit with a retryable error naming the reason.
        with pytest.raises(UnavailableError, match=r"not admitting new Environments now \(pressure: disk"):
            agent.admit(pending_record(running))
        # The running Environment is untouched: still Running and answering through the Relay.
        assert (await api.get(running.id)).state is EnvironmentState.RUNNING
        assert await run_via_relay(nc, relay, running.id, ["sh", "-c", "echo alive"]) == ("alive\n", 0)

        # Between the marks (~35%): still closed (hysteresis).
        (small_fs / "ballast" / "b").unlink()
        assert 0.3 <= read_disk_used(small_fs) < 0.5
        await asyncio.sleep(1.5)  # three report rounds
        node = await node_record(nc)
        assert not node.admission_open and "reopens below" in node.admission_reason
        # Below the low mark: admitted again.
        (small_fs / "ballast" / "a").unlink()
        await wait_node(nc, lambda n: n.admission_open and n.admission_reason == "")
        again = await api.create()
        assert again.node == "n1"
        await api.wait_state(again.id, EnvironmentState.RUNNING)

        # Memory at its high mark closes it too; the disk is fine.
        mem.write_text(meminfo(16_000_000, 1_000_000))  # 94% in use
        node = await wait_node(nc, lambda n: not n.admission_open)
        assert "memory 94% >= high 90%" in node.admission_reason
        mem.write_text(meminfo(16_000_000, 12_000_000))
        await wait_node(nc, lambda n: n.admission_open)

        # A failed pressure read closes admission; it reopens once a read shows both below low.
        mem.unlink()
        node = await wait_node(nc, lambda n: not n.admission_open)
        assert node.admission_reason.startswith("pressure read failed: memory pressure: cannot read")
        with pytest.raises(Exception, match="pressure read failed"):
            await api.create()
        mem.write_text(meminfo(16_000_000, 12_000_000))
        await wait_node(nc, lambda n: n.admission_open)
        for env in (running, again):
            assert (await api.get(env.id)).state is EnvironmentState.RUNNING
    finally:
        await api.close()


@pytest.mark.req("RES-7")
async def test_disk_pressure_is_measured_on_sandboxds_state_directory(node_cluster) -> None:
    """Without ``pressure.disk_path`` the node measures the filesystem of the state directory sandboxd names."""
    nc = await node_cluster()
    agent = nc.nodes["n1"]
    daemon = nc.sandboxds["n1"]
    assert await agent._sandbox_disk_path() == daemon.state_dir
    gate = await agent.reporter.pressure.check()
    assert gate.last is not None
    assert abs(gate.last.disk_used - read_disk_used(daemon.state_dir)) < 0.01
    # sandboxd down: the node cannot learn where to measure, a failed read, which closes admission.
    await asyncio.to_thread(daemon.stop)
    try:
        gate = await agent.reporter.pressure.check()
        assert gate.closed and gate.reason.startswith("pressure read failed: sandboxd's state directory")
    finally:
        await asyncio.to_thread(daemon.start)
    gate = await agent.reporter.pressure.check()
    assert not gate.closed


def pending_record(like: EnvironmentRecord) -> EnvironmentRecord:
    return like.model_copy(update={"id": "env-pressure-probe", "state": EnvironmentState.PENDING, "revision": 1})
