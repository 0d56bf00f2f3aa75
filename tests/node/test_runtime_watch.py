"""The node's runtime watch on the real stack: probe failures (RST-6), workload checkpoint requests (CTL-7) and
execd reconnects (CTL-5), all read from sandboxd's one runtime-control subscription."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from test_idle import relay_url
from test_node_agent import Api, relay_client

from adx.model import EnvironmentState

S = EnvironmentState


@pytest.mark.req("RST-6", "CTL-1", "RST-1")
async def test_probe_failures_reaching_the_threshold_end_the_execution(node_cluster) -> None:
    nc = await node_cluster()
    api = Api(nc)
    try:
        probed = {
            "healthProbe": {"command": "test ! -f /tmp/sick", "intervalSeconds": 0.2, "timeoutSeconds": 1},
        }
        watched = await api.create(lifecycle={**probed, "execdHealthFailureThreshold": 2})
        unwatched = await api.create(lifecycle=probed)  # RST-6: no threshold, failures never end it
        for env in (watched, unwatched):
            await api.wait_state(env.id, S.RUNNING)
            async with relay_client(nc) as client:
                made = await client.post(
                    await relay_url(api, env.id, "/v1/commands"), json={"argv": ["touch", "/tmp/sick"]}
                )
                assert made.status_code == 200, made.text
        failed = await api.wait_state(watched.id, S.FAILED, within=20)
        assert failed.last_error is not None and "health probe failed" in failed.last_error
        # RST-1: cleanup was confirmed before Failed: the sandbox is gone.
        assert watched.id not in {s.metadata.get("adx.env") for s in await nc.nodes["n1"].driver.client.list()}
        await asyncio.sleep(1.5)
        assert (await api.get(unwatched.id)).state is S.RUNNING
    finally:
        await api.close()


@pytest.mark.req("CTL-7", "CTL-1")
async def test_a_workload_checkpoint_request_is_captured_committed_and_acknowledged(node_cluster) -> None:
    nc = await node_cluster()
    api = Api(nc)
    try:
        env = await api.create()
        running = await api.wait_state(env.id, S.RUNNING)
        async with relay_client(nc) as client:
            wrote = await client.post(
                await relay_url(api, env.id, "/v1/commands"), json={"argv": ["sh", "-c", "echo v1 > /work/state"]}
            )
            assert wrote.status_code == 200
            for _ in range(2):  # a duplicate request changes nothing (CTL-7: one budget, one capture)
                asked = await client.post(
                    await relay_url(api, env.id, "/v1/checkpoint-requests"), json={"operationId": "op-1"}
                )
                assert asked.status_code in (200, 201, 202), asked.text
        deadline = time.monotonic() + 20
        while (record := await api.get(env.id)).checkpoint is None:
            assert time.monotonic() < deadline, "the checkpoint was not committed"
            await asyncio.sleep(0.1)
        assert record.state is S.RUNNING and record.execution_id == running.execution_id
        assert (Path(record.checkpoint.location) / "manifest.json").exists()
        # Acknowledged: execd dropped the request from what it reports.
        sandbox_id = running.execution_id
        control = nc.nodes["n1"].control
        deadline = time.monotonic() + 10
        controller = nc.nodes["n1"].controllers[env.id]
        # The Controller drops its pending item right after the ack returns, which may be after execd's report.
        while control.states[sandbox_id].checkpoint_requests or controller.checkpoint_requests:
            assert time.monotonic() < deadline, "the request was never acknowledged"
            await asyncio.sleep(0.05)
        assert controller.checkpoint_requests == {}
    finally:
        await api.close()


@pytest.mark.req("CTL-5", "CTL-3", "CTL-4")
async def test_an_execd_reconnect_cancels_the_pending_confirmation(node_cluster) -> None:
    """sandboxd (which holds every execd's control connection) is SIGKILLed and kept down past the reconnect
    window: the observations are cleared, the backend cannot be confirmed (unknown is no evidence), so the
    Environment keeps running; once sandboxd is back and execd reconnected, nothing was ended."""
    nc = await node_cluster()
    api = Api(nc)
    try:
        plain = await api.create()
        watched = await api.create(lifecycle={"execdHealthFailureThreshold": 1})
        for env in (plain, watched):
            await api.wait_state(env.id, S.RUNNING)
        agent = nc.nodes["n1"]
        daemon = nc.sandboxds["n1"]
        daemon.kill()
        await asyncio.sleep(0.5)
        assert agent.control.states == {}  # CTL-3: a broken stream clears the observations
        await asyncio.sleep(6.0)  # past both windows (5 s; threshold 1 x 5 s)
        daemon.start()
        deadline = time.monotonic() + 20
        while len(agent.control.states) < 2:
            assert time.monotonic() < deadline, "execd did not reconnect"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # a few runtime-watch rounds after the reconnect
        for env in (plain, watched):
            record = await api.get(env.id)
            assert record.state is S.RUNNING, record
            async with relay_client(nc) as client:
                ran = await client.post(await relay_url(api, env.id, "/v1/commands"), json={"argv": ["true"]})
                assert ran.status_code == 200, ran.text
        assert agent._disconnected == {}
    finally:
        await api.close()
