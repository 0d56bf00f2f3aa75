"""Idle delete on the real stack (IDLE-1..5): execd's activity via the runtime-control stream + the Relay."""

from __future__ import annotations

import asyncio
import time

import pytest
from test_node_agent import Api, relay_client

from adx.model import EnvironmentState

S = EnvironmentState


def idle(seconds: int, action: str = "delete") -> dict[str, object]:
    return {"lifecycle": {"idleTimeoutSeconds": seconds, "idleAction": action}}


async def relay_url(api: Api, env_id: str, path: str) -> str:
    relay = await api.route(env_id)
    return f"https://{relay.replace('127.0.0.1', 'localhost')}/{env_id}{path}"


@pytest.mark.req("IDLE-2", "IDLE-5")
async def test_idle_environment_is_deleted_after_the_window_not_before(node_cluster) -> None:
    nc = await node_cluster()
    api = Api(nc)
    try:
        created = await api.create(**idle(2))
        running = await api.wait_state(created.id, S.RUNNING)
        started = time.monotonic()
        await asyncio.sleep(1.2)
        assert (await api.get(created.id)).state is S.RUNNING
        await api.wait_state(created.id, S.DELETED, within=10)
        assert time.monotonic() - started >= 1.9
        sandboxes = await nc.nodes["n1"].driver.client.list()
        assert running.execution_id not in {s.sandbox_id for s in sandboxes}
    finally:
        await api.close()


@pytest.mark.req("IDLE-1")
async def test_zero_idle_timeout_never_reclaims(node_cluster) -> None:
    nc = await node_cluster()
    api = Api(nc)
    try:
        created = await api.create(**idle(0))
        await api.wait_state(created.id, S.RUNNING)
        await asyncio.sleep(3)
        assert (await api.get(created.id)).state is S.RUNNING
    finally:
        await api.close()


@pytest.mark.req("IDLE-2", "IDLE-3")
async def test_an_open_stream_keeps_it_alive_a_left_background_command_does_not(node_cluster) -> None:
    nc = await node_cluster()
    api = Api(nc)
    try:
        created = await api.create(**idle(2))
        await api.wait_state(created.id, S.RUNNING)
        async with relay_client(nc) as client:
            # A 4 s command streamed through the Relay: the Environment is busy the whole time.
            started = time.monotonic()
            response = await client.post(
                await relay_url(api, created.id, "/v1/commands"), json={"argv": ["sh", "-c", "sleep 4; echo done"]}
            )
            assert response.status_code == 200 and '"done\\n"' in response.text
            assert time.monotonic() - started >= 3.9
            assert (await api.get(created.id)).state is S.RUNNING
            # A background command whose client leaves at once: still running, yet not activity.
            bg = await client.post(
                await relay_url(api, created.id, "/v1/commands"), json={"argv": ["sleep", "60"], "background": True}
            )
            assert bg.status_code == 201, bg.text
        await api.wait_state(created.id, S.DELETED, within=10)
    finally:
        await api.close()


@pytest.mark.req("ENV-2")
async def test_pause_is_placed_only_on_a_node_that_can_checkpoint(node_cluster) -> None:
    """A node advertises checkpoint capability from its runtime; idleAction=pause is placed only there."""
    nc = await node_cluster()
    api = Api(nc)
    try:
        assert (await nc.cluster.coordinator.store.get_node("n1")).checkpoint_capable
        created = await api.create(**idle(60, "pause"))
        assert created.node == "n1"
        await api.wait_state(created.id, S.RUNNING)
    finally:
        await api.close()


@pytest.mark.req("IDLE-4")
async def test_a_broken_observation_stream_restarts_the_window(node_cluster) -> None:
    """sandboxd (the runtime-control stream) goes away 1 s into a 2 s window for 3 s: nothing is reclaimed
    without fresh information, and the window starts again only once execd is observed again."""
    nc = await node_cluster()
    api = Api(nc)
    try:
        created = await api.create(**idle(2))
        await api.wait_state(created.id, S.RUNNING)
        await asyncio.sleep(1.0)
        daemon, agent = nc.sandboxds["n1"], nc.nodes["n1"]
        daemon.kill()
        await asyncio.sleep(3.0)  # longer than the window: an unobserved Environment is never idle
        assert (await api.get(created.id)).state is S.RUNNING
        daemon.start()
        deadline = time.monotonic() + 20
        while not agent.control.states:
            assert time.monotonic() < deadline, "execd was not observed again"
            await asyncio.sleep(0.05)
        observed_again = time.monotonic()
        await api.wait_state(created.id, S.DELETED, within=15)
        assert time.monotonic() - observed_again >= 1.9  # a whole new window after the stream came back
    finally:
        await api.close()
