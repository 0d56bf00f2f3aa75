"""The bench-only recording runtime (``[runtime] bench_record_only``): a real adxlet whose executions are only
recorded, so bench/bench_control_plane.py can put thousands of Environments on many adxlet processes. It must
still go through the whole control plane: placement, the Starting and Running commits, delete."""

from __future__ import annotations

import pytest
from test_node_agent import Api

from adx.model import EnvironmentState
from adx.runtime._recording import RecordingDriver


async def test_a_recording_node_runs_the_control_plane_and_nothing_else(node_cluster) -> None:
    nc = await node_cluster(capacity={"cpuMillis": 1000, "memoryBytes": 2**30}, recording=True)
    driver = nc.nodes["n1"].driver
    assert isinstance(driver, RecordingDriver)
    api = Api(nc)
    try:
        made = [await api.create(resources={"cpuMillis": 300, "memoryBytes": 2**28}) for _ in range(3)]
        for record in made:
            running = await api.wait_state(record.id, EnvironmentState.RUNNING)
            assert running.node == "n1"
        assert driver.starts == 3 and len(driver.recorded) == 3
        # Placement still counts the reservations: a fourth of 300 millicores does not fit 1000.
        try:
            await api.create(resources={"cpuMillis": 300, "memoryBytes": 2**28})
            raise AssertionError("a fourth Environment was placed past the node's CPU")
        except Exception as exc:  # the Coordinator's refusal, as the API server sees it
            assert "no capacity" in str(exc), exc
        await api.delete(made[0].id)
        await api.wait_state(made[0].id, EnvironmentState.DELETED)
        assert driver.stops == 1 and len(driver.recorded) == 2
    finally:
        await api.close()


@pytest.mark.req("RES-4")
async def test_a_burst_of_creates_spreads_over_the_nodes(node_cluster) -> None:
    """Placement ranks nodes by the room they have left, from the Coordinator's cached node records, which the
    nodes' reports refresh. A create between two reports must count in that view at once: it did not, so every
    create of a burst went to the same node (bench_control_plane: 50 of 50 on one of two nodes, 169 of 300 on
    one of four). Ten creates on two nodes that report once a minute: five each."""
    nc = await node_cluster(
        nodes=("n1", "n2"), capacity={"cpuMillis": 1000, "memoryBytes": 2**30}, report_interval=60, recording=True
    )
    api = Api(nc)
    try:
        made = [await api.create(resources={"cpuMillis": 50, "memoryBytes": 2**20}) for _ in range(10)]
        placed = [record.node for record in made]
        assert sorted(placed.count(name) for name in ("n1", "n2")) == [5, 5], placed
    finally:
        await api.close()
