"""Restart policy on the real stack (Coordinator + adxlet + sandboxd + execd): RST-1..5."""

from __future__ import annotations

import asyncio
import itertools
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
async def test_two_restarts_with_new_execution_ids_then_failed(node_cluster) -> None:
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
async def test_delete_cancels_a_pending_restart(node_cluster) -> None:
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
async def test_restart_counters_survive_an_adxlet_restart(node_cluster) -> None:
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


@pytest.mark.req("MET-6", "CTL-6")
async def test_a_failing_cleanup_backs_off_and_routine_checks_never_push_its_retry_later(node_cluster) -> None:
    """sandboxd refuses the delete of an execution three times (a fault injected into the runtime's stop): the
    retries come after 1, 2 and 4 s, while the node's routine checks run every 0.5 s and neither retry sooner
    nor push a retry later; the delete is committed only after the cleanup is confirmed."""
    from adx.errors import UnavailableError

    nc = await node_cluster(report_interval=0.5)
    agent = nc.nodes["n1"]
    api = Api(nc)
    real_stop = agent.driver.stop
    attempts: list[float] = []

    async def flaky_stop(execution):
        attempts.append(time.monotonic())
        if len(attempts) <= 3:
            raise UnavailableError("sandboxd: delete failed (injected)")
        await real_stop(execution)

    try:
        created = await api.create()
        await api.wait_state(created.id, EnvironmentState.RUNNING)
        agent.driver.stop = flaky_stop
        await api.delete(created.id)
        deleting = await api.get(created.id)
        assert deleting.state is EnvironmentState.DELETING
        await api.wait_state(created.id, EnvironmentState.DELETED, within=30)
        gaps = [round(b - a, 1) for a, b in itertools.pairwise(attempts)]
        assert len(attempts) == 4, gaps
        for gap, expected in zip(gaps, (1.0, 2.0, 4.0), strict=True):
            assert expected - 0.05 <= gap <= expected + 0.75, gaps
    finally:
        agent.driver.stop = real_stop
        await api.close()
