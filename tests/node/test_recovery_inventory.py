"""NOD-1/NOD-18: what the runtime holds for a node without the node's execution file (its state directory was
damaged) is taken over at the next start: adopted when the catalog references it, cleaned when not. Real
Coordinator + Redis, adxlet, sandboxd and execd."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_node_agent import Api, run_via_relay

from adx.errors import AdxError
from adx.model import EnvironmentSpec, EnvironmentState, Resources, new_id
from adx.node._agent import NodeAgent
from adx.runtime import ExecutionSpec

S = EnvironmentState


@pytest.mark.req("NOD-1", "NOD-18")
async def test_executions_whose_files_were_lost_are_adopted_or_cleaned_at_the_next_start(node_cluster) -> None:
    """Two executions run in sandboxd with no file on the node: one is the committed execution of a Running
    Environment (its file was deleted while the adxlet was down), the other belongs to no Environment (a
    start whose file was lost). The next adxlet adopts the first under a new secret (same execution, same
    processes, no restart) and deletes the second; nothing else is touched."""
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        created = await api.create()
        running = await api.wait_state(created.id, S.RUNNING)
        relay = await api.route(created.id)
        assert await run_via_relay(nc, relay, created.id, ["sh", "-c", "echo $$ > /work/pid; cat /work/pid"])
        old = agent.executions.get(running.execution_id or "")
        assert old is not None
        ghost_id = new_id("exe")
        ghost_spec = EnvironmentSpec(resources=Resources(cpu_millis=100, memory_bytes=64 * 2**20))
        ghost = await agent.driver.start(ExecutionSpec("env-ghost", 1, ghost_id, ghost_spec))
        await agent.stop()
        agent.executions.forget(running.execution_id or "")
        assert agent.executions.load_all() == []  # the ghost never had one

        successor = NodeAgent(agent.config)
        nc.nodes["n1"] = successor
        await successor.start()
        adopted = await api.wait_state(created.id, S.RUNNING, within=30)
        assert (adopted.execution_id, adopted.restart_attempts) == (running.execution_id, 0)
        controller = successor.controllers[created.id]
        assert controller.execution is not None and controller.execution.execution_id == running.execution_id
        saved = successor.executions.get(running.execution_id or "")
        assert saved is not None and saved.native["token"] != old.native["token"]  # a new secret, on disk
        with pytest.raises(AdxError):
            await successor.driver.stats(old)  # the lost secret no longer opens it
        relay = await api.route(created.id)
        out, code = await run_via_relay(nc, relay, created.id, ["cat", "/work/pid"])
        assert code == 0 and out.strip()  # the same sandbox: the file written before is there
        deadline = time.monotonic() + 15
        while any(item.execution_id == ghost_id for item in await successor.driver.inventory()):
            assert time.monotonic() < deadline, "the ownerless execution was not cleaned"
            await asyncio.sleep(0.2)
        assert successor.executions.get(ghost_id) is None and not successor._orphans
        assert successor.unaddressable == [] and successor.reporter.admission_open
        assert ghost.execution_id == ghost_id
        inventory = await successor.driver.inventory()
        assert [item.execution_id for item in inventory] == [running.execution_id]
    finally:
        await api.close()


@pytest.mark.req("NOD-1", "SBX-6", "RST-7")
async def test_a_runtime_that_restarts_during_the_node_start_fails_nothing(node_cluster) -> None:
    """sandboxd is SIGKILLed just after the restarting adxlet subscribed to it and read the catalog, so the
    recovery's query of the running execution gets no answer, and it comes back 2 s later. An unanswered query
    is no evidence of an exit: the Environment stays Running on the same execution, with no restart and no
    Failed (the 30-min soak, seed 378333975, failed an Environment with 'the execution ended while the node
    was away' this way)."""
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    daemon = nc.sandboxds["n1"]
    try:
        created = await api.create()
        running = await api.wait_state(created.id, S.RUNNING)
        await agent.stop()
        successor = NodeAgent(agent.config)
        nc.nodes["n1"] = successor
        real_catalog = successor._wait_for_catalog

        async def runtime_dies_once_the_catalog_is_read(**kwargs: Any) -> Any:
            catalog = await real_catalog(**kwargs)
            if daemon.proc is not None and daemon.proc.poll() is None:
                daemon.kill()
                asyncio.get_running_loop().call_later(2.0, daemon.start)
            return catalog

        successor._wait_for_catalog = runtime_dies_once_the_catalog_is_read  # type: ignore[method-assign]
        await successor.start()
        await asyncio.sleep(4.0)  # sandboxd is back; the recovery asked again
        after = await api.wait_state(created.id, S.RUNNING, within=30)
        assert (after.execution_id, after.restart_attempts) == (running.execution_id, 0)
        controller = successor.controllers[created.id]
        deadline = time.monotonic() + 20
        while not controller.serving:
            assert time.monotonic() < deadline, f"not serving: {controller.state.value}"
            await asyncio.sleep(0.1)
        relay = await api.route(created.id)
        assert await run_via_relay(nc, relay, created.id, ["echo", "alive"]) == ("alive\n", 0)
        assert (await api.get(created.id)).state is S.RUNNING
    finally:
        await api.close()
