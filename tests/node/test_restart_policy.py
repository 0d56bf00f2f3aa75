"""Restart policy on the real stack (Coordinator + adxlet + sandboxd + execd): RST-1..5."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_node_agent import Api

from adx.model import EnvironmentRecord, EnvironmentState, Resources

S = EnvironmentState


async def history(api: Api, env_id: str, until: Any, within: float = 60) -> list[EnvironmentRecord]:
    """Every distinct committed version seen while polling, until ``until(record)``."""
    seen: list[EnvironmentRecord] = []
    deadline = time.monotonic() + within
    while True:
        record = await api.get(env_id)
        if not seen or record.revision != seen[-1].revision:
            seen.append(record)
        if until(record):
            return seen
        assert time.monotonic() < deadline, [(r.state.value, r.restart_attempts) for r in seen]
        await asyncio.sleep(0.02)


def restarting(max_retries: int, backoff: float, script: str = "sleep 1; exit 3") -> dict[str, Any]:
    return {
        "entrypoint": ["sh", "-c", script],
        "lifecycle": {
            "restartPolicy": {
                "maxRetries": max_retries,
                "initialBackoffSeconds": backoff,
                "maxBackoffSeconds": backoff * 4,
            }
        },
    }


@pytest.mark.req("RST-1", "RST-2", "RST-5")
async def test_two_restarts_with_new_execution_ids_then_failed(node_cluster) -> None:  # type: ignore[no-untyped-def]
    nc = await node_cluster()
    api = Api(nc)
    try:
        created = await api.create(**restarting(max_retries=2, backoff=0.2))
        seen = await history(api, created.id, lambda r: r.state is S.FAILED and not r.restart_pending)
        final = seen[-1]
        assert final.restart_attempts == 2
        assert final.last_error == "exited with status 3"
        executions = {r.execution_id for r in seen if r.state is S.RUNNING}
        assert len(executions) == 3  # the first run and two restarts, each its own execution
        assert {r.generation for r in seen} == {1}  # same ownership generation throughout
        pending = [r for r in seen if r.state is S.FAILED and r.restart_pending]
        assert [r.restart_attempts for r in pending] == [0, 1]
        # While a restart was pending the reservation stayed; after the final failure it is released.
        assert (await nc.cluster.coordinator.store.get_node("n1")).reserved == Resources()
        sandboxes = await nc.nodes["n1"].driver.client.list()
        assert not executions & {s.sandbox_id for s in sandboxes}  # every execution was cleaned up
    finally:
        await api.close()


@pytest.mark.req("RST-4", "RST-7")
async def test_delete_cancels_a_pending_restart(node_cluster) -> None:  # type: ignore[no-untyped-def]
    nc = await node_cluster()
    api = Api(nc)
    try:
        never_starts = {**restarting(max_retries=3, backoff=5.0), "entrypoint": ["/does/not/exist"]}
        created = await api.create(**never_starts)
        # A workload that cannot start fails its first start: RST-7, no restart even with a policy.
        first = await api.wait_state(created.id, S.FAILED)
        assert (first.restart_pending, first.restart_attempts) == (False, 0)

        created = await api.create(**restarting(max_retries=3, backoff=5.0))
        pending = await history(api, created.id, lambda r: r.state is S.FAILED and r.restart_pending)
        assert pending[-1].restart_attempts == 0
        await api.delete(created.id)
        await api.wait_state(created.id, S.DELETED)
        await asyncio.sleep(5.5)  # past the backoff: nothing restarts a deleted Environment
        after = await api.get(created.id)
        assert after.state is S.DELETED and after.restart_attempts == 0
        assert (await nc.cluster.coordinator.store.get_node("n1")).reserved == Resources()
    finally:
        await api.close()


@pytest.mark.req("RST-3")
async def test_restart_counters_survive_an_adxlet_restart(node_cluster) -> None:  # type: ignore[no-untyped-def]
    nc = await node_cluster()
    api = Api(nc)
    try:
        created = await api.create(**restarting(max_retries=2, backoff=1.5))
        await history(api, created.id, lambda r: r.state is S.FAILED and r.restart_pending)
        agent = nc.nodes["n1"]
        await agent.stop()  # the adxlet goes away with a restart pending
        from adx.node._agent import NodeAgent

        successor = NodeAgent(agent.config)
        await successor.start()
        nc.nodes["n1"] = successor
        try:
            seen = await history(api, created.id, lambda r: r.state is S.FAILED and not r.restart_pending)
            assert seen[-1].restart_attempts == 2  # counted on from the committed record, not reset
        finally:
            await successor.stop()
    finally:
        await api.close()
