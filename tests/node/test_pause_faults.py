"""A pause that fails after its freeze, with the runtime gone at that moment (real sandboxd SIGKILLed)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_node_agent import Api, relay_client
from test_routine_check import pause

from adx.errors import AdxError
from adx.model import EnvironmentState

S = EnvironmentState


@pytest.mark.req("IDLE-6", "SBX-10")
async def test_a_pause_cut_short_after_its_freeze_thaws_once_the_runtime_is_back(node_cluster) -> None:
    """The freeze is acknowledged (sandboxd wrote its paused record), then sandboxd is SIGKILLed before the
    capture: the pause is cancelled and the Environment runs on, so its thaw must be confirmed, retried until
    the restarted sandboxd answers. Before, the one thaw attempt failed against the dead socket and commands
    then hung on a frozen sandbox of an Environment reported Running."""
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    daemon = nc.sandboxds["n1"]
    try:
        created = await api.create()
        running = await api.wait_state(created.id, S.RUNNING)
        real_checkpoint = agent.driver.checkpoint
        killed = asyncio.Event()

        async def sandboxd_dies_before_the_capture(execution: Any, *args: Any, **kwargs: Any) -> Any:
            if not killed.is_set():
                killed.set()
                daemon.kill()
                asyncio.get_running_loop().call_later(1.5, daemon.start)
            return await real_checkpoint(execution, *args, **kwargs)

        agent.driver.checkpoint = sandboxd_dies_before_the_capture  # type: ignore[method-assign]
        try:
            with pytest.raises(AdxError):
                await pause(api, created.id)
        finally:
            agent.driver.checkpoint = real_checkpoint  # type: ignore[method-assign]
        assert killed.is_set()
        after = await api.wait_state(created.id, S.RUNNING, within=30)
        assert after.execution_id == running.execution_id
        relay = await api.route(created.id)
        deadline = time.monotonic() + 30
        async with relay_client(nc) as client:
            while True:
                url = f"https://{relay.replace('127.0.0.1', 'localhost')}/{created.id}/v1/commands"
                try:
                    response = await client.post(url, json={"argv": ["echo", "thawed"]}, timeout=5)
                except Exception as exc:  # a frozen sandbox never answers: the read times out
                    assert time.monotonic() < deadline, f"the sandbox stayed frozen: {exc!r}"
                    continue
                if response.status_code == 200:
                    break
                assert time.monotonic() < deadline, response.text
                await asyncio.sleep(0.2)
        assert '"thawed\\n"' in response.text
    finally:
        await api.close()
