"""Disk admission is one rule (issue 16): the Coordinator places an Environment only where sandboxd admits it.

The bug: an Environment that asks no disk (the SDK's default) reserved nothing on the Coordinator (ENV-5) while
sandboxd reserved its ``defaults.disk_bytes`` (1 GiB) for it, so placement went on past what sandboxd admitted
(~250 on a 252 GiB disk) and those starts failed with ``insufficient disk_bytes``; and the node reported the
filesystem's free space where sandboxd admits against its own capacity, so a large request was placed where
sandboxd refused it. Real Coordinator, Redis, adxlet, sandboxd and API server.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from apistack import ApiStack
from test_capacity import assert_capacity_503, wait_admitting

GiB = 2**30
MiB = 2**20


def spec(disk: int = 0, memory: int = 64 * MiB) -> dict[str, Any]:
    return {"resources": {"cpuMillis": 50, "memoryBytes": memory, "diskBytes": disk}}


async def settled(http: httpx.AsyncClient, env_id: str) -> dict[str, Any]:
    """The Environment once it left pending/starting (running, or failed with its reason)."""
    deadline = time.monotonic() + 120  # a start takes seconds at load 30 on this 2-core machine
    while time.monotonic() < deadline:
        body: dict[str, Any] = (await http.get(f"/v1/environments/{env_id}")).json()
        if body["state"] not in ("pending", "starting"):
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"{env_id} never settled")


@pytest.mark.req("RES-2", "RES-4", "RES-6")
async def test_placement_admits_exactly_what_sandboxd_admits(node_cluster, api_for) -> None:
    """sandboxd holds 2 GiB of disk and 1 GiB of memory for sandboxes (its 1 GiB default disk unchanged).

    - Three Environments without disk all run: no disk asked is no disk reserved, on both sides (RES-6). Before
      the fix the third failed with ``insufficient disk_bytes`` (sandboxd reserved 1 GiB for each).
    - The node reports sandboxd's capacity (2 GiB disk, 1 GiB memory), not the host's free disk or memory.
    - A 3 GiB disk (or 2 GiB memory) request is refused by the Coordinator with a retryable 503 instead of being
      placed into a failed start; 1.5 GiB of disk runs, and then 1 GiB more is refused (0.5 GiB left).
    """
    nc = await node_cluster(
        sandboxd_resources=True,
        sandboxd_config={"capacity": {"disk_bytes": 2 * GiB, "memory_bytes": 1 * GiB}, "warm_pool": 0},
    )
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    await wait_admitting(stack, "n1")
    async with stack.http(key) as http:
        made = [await http.post("/v1/environments", json=spec()) for _ in range(3)]
        assert [r.status_code for r in made] == [201] * 3, [r.text for r in made]
        for response in made:
            body = await settled(http, response.json()["id"])
            assert body["state"] == "running", body
        node = await stack.cluster.coordinator.store.get_node("n1")
        assert (node.capacity.disk_bytes, node.capacity.memory_bytes) == (2 * GiB, 1 * GiB)
        too_big = await http.post("/v1/environments", json=spec(disk=3 * GiB))
        assert_capacity_503(too_big)
        assert "disk" in too_big.json()["error"]["message"]
        assert_capacity_503(await http.post("/v1/environments", json=spec(memory=2 * GiB)))
        fits = await http.post("/v1/environments", json=spec(disk=3 * GiB // 2))
        assert fits.status_code == 201, fits.text
        assert (await settled(http, fits.json()["id"]))["state"] == "running"
        assert_capacity_503(await http.post("/v1/environments", json=spec(disk=1 * GiB)))
    node = await stack.cluster.coordinator.store.get_node("n1")
    assert node.reserved.disk_bytes == 3 * GiB // 2
