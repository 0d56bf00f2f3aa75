"""CTL-8: the node, sandboxd and execd speak one runtime-control protocol; a mismatch is refused loudly."""

from __future__ import annotations

import pytest
from test_node_agent import Api, run_via_relay

from adx.errors import VersionMismatchError
from adx.model import EnvironmentState
from adx.node._agent import NodeAgent
from adx.sandboxd import _control_client

S = EnvironmentState


@pytest.mark.req("CTL-8")
async def test_a_node_of_another_runtime_control_protocol_refuses_to_start_and_touches_nothing(
    node_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adxlet is upgraded alone (its runtime-control protocol moves on; the real sandboxd keeps the old
    one): its start fails at once with an error naming both versions and the fix, and the running Environment
    is untouched; the matching adxlet then starts and adopts it."""
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        created = await api.create()
        running = await api.wait_state(created.id, S.RUNNING)
        await agent.stop()
        monkeypatch.setattr(_control_client, "PROTOCOL_VERSION", _control_client.PROTOCOL_VERSION + 1)
        upgraded = NodeAgent(agent.config)
        with pytest.raises(VersionMismatchError) as refused:
            await upgraded.start()
        message = str(refused.value)
        assert "speaks runtime-control protocol 1" in message and "this node speaks 2" in message
        assert "upgrade the node, sandboxd and execd together" in message
        await upgraded.stop()
        monkeypatch.undo()
        successor = NodeAgent(agent.config)
        nc.nodes["n1"] = successor
        await successor.start()
        adopted = await api.wait_state(created.id, S.RUNNING)
        assert adopted.execution_id == running.execution_id
        relay = await api.route(created.id)
        assert await run_via_relay(nc, relay, created.id, ["echo", "same"]) == ("same\n", 0)
    finally:
        await api.close()
