"""Pause, resume and wake on traffic on the real stack: SDK -> API server + Ingress -> Coordinator (Redis) ->
adxlet + Relay -> sandboxd (filesystem checkpoints) -> execd. ENV-3/4, IDLE-5/6, CRD-5/6/8/9, CTL-6."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from apistack import ApiStack

import adx
from adx.model import EnvironmentState, Resources

S = EnvironmentState


async def wait_state(env: adx.AsyncEnvironment, state: str, within: float = 30) -> adx.AsyncEnvironment:
    deadline = time.monotonic() + within
    while (await env.refresh()).state != state:
        assert time.monotonic() < deadline, f"{env.id} is {env.state}, expected {state}"
        await asyncio.sleep(0.05)
    return env


def artifacts(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if (p / "manifest.json").exists()} if root.exists() else set()


def root_of(checkpoint: dict[str, Any]) -> Path:
    return Path(checkpoint.location).parent


async def eventually(predicate: Any, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


@pytest.mark.req("IDLE-5", "IDLE-6", "ENV-4", "CTL-6", "CRD-9")
async def test_idle_pause_then_wake_three_cycles_lose_nothing(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", idle_timeout=2, idle_action="pause")
        generation_one_execution = env.execution_id
        executions = {generation_one_execution}
        for cycle in range(1, 4):
            await env.files.write(f"/work/cycle-{cycle}.txt", f"written in cycle {cycle}".encode())
            await env.commands.run(f"echo {cycle} >> /work/log")
            paused = await wait_state(env, "paused", within=20)
            assert paused.checkpoint is not None and paused.checkpoint.storage == "local"
            root = root_of(paused.checkpoint)
            # Resources are released once the checkpoint is published (ENV-3).
            assert (await nc.cluster.coordinator.store.get_node("n1")).reserved == Resources()
            # Business traffic wakes it (ENV-4): the caller only sees latency.
            log = await env.commands.run("cat /work/log")
            assert log.stdout == "".join(f"{i}\n" for i in range(1, cycle + 1)), log
            for earlier in range(1, cycle + 1):
                assert await env.files.read(f"/work/cycle-{earlier}.txt") == f"written in cycle {earlier}".encode()
            await env.refresh()
            assert env.state == "running" and env.execution_id not in executions
            executions.add(env.execution_id)
        # CRD-9: every resumed-from checkpoint was retired and deleted; none is left behind.
        await eventually(lambda: not artifacts(root))
        await env.delete()


@pytest.mark.req("CRD-1", "CRD-5", "ENV-3")
async def test_manual_pause_and_resume(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(
            cpu=0.25, memory="256Mi", pause=adx.PausePolicy(retention=adx.Retention.forever())
        )
        first_execution = env.execution_id
        await env.files.write("/work/kept.txt", b"kept")
        await env.pause()
        assert env.state == "paused" and env.execution_id is None
        assert env.checkpoint is not None and env.checkpoint.expires_at is None  # retained forever
        assert env.checkpoint.id in artifacts(root_of(env.checkpoint))
        sandboxes = {s.sandbox_id for s in await nc.nodes["n1"].driver.client.list()}
        assert first_execution not in sandboxes  # the execution was stopped after publication
        with pytest.raises(adx.ConflictError, match="already paused"):
            await env.pause()
        await env.resume()
        assert env.state == "running" and env.execution_id not in (None, first_execution)
        assert await env.files.read("/work/kept.txt") == b"kept"
        await env.resume()  # resuming a running Environment is a no-op
        await env.delete()


@pytest.mark.req("IDLE-6")
async def test_requests_racing_the_automatic_pause_are_never_lost(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", idle_timeout=1, idle_action="pause")
        states: set[str] = set()
        # Requests arrive around the end of each idle window: some before capture (the pause is cancelled),
        # some after (served after the resume). Each must be served exactly once.
        for i in range(12):
            await asyncio.sleep(0.8 + (i % 5) * 0.1)
            result = await env.commands.run(f"echo {i} >> /work/seen; echo {i}")
            assert (result.exit_code, result.stdout) == (0, f"{i}\n")
            states.add((await env.refresh()).state)
        seen = await env.commands.run("cat /work/seen")
        assert seen.stdout.split() == [str(i) for i in range(12)]
        await env.delete()


@pytest.mark.req("CRD-5", "CRD-6", "ENV-3")
async def test_shared_checkpoint_resumes_on_another_node_when_its_node_is_gone(node_cluster, api_for) -> None:
    nc = await node_cluster(nodes=("n1", "n2"), shared_checkpoints=True, session_ttl=2.0)
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(
            cpu=0.25, memory="256Mi", pause=adx.PausePolicy(storage=adx.CheckpointStorage.SHARED)
        )
        first_node = env.node
        other = "n2" if first_node == "n1" else "n1"
        await env.files.write("/work/travel.txt", b"from " + first_node.encode())
        await env.pause()
        assert env.checkpoint.storage == "shared"
        await nc.nodes[first_node].stop()  # node A goes away (its session expires)
        await wait_state(env, "paused")
        await eventually(lambda: nc.cluster.coordinator.service.cache.environments[env.id].ownership_lost, 10)
        # The first request resumes it on node B (CRD-6: a lost paused object resumes elsewhere).
        assert await env.files.read("/work/travel.txt") == b"from " + first_node.encode()
        await env.refresh()
        assert env.state == "running" and env.node == other


@pytest.mark.req("CRD-10", "CRD-6", "CRD-5")
async def test_a_recovery_whose_target_node_is_lost_goes_on_to_another_node_by_itself(
    node_cluster, api_for, monkeypatch
) -> None:
    """Node A holding a paused (shared) Environment is lost; the first demand starts its recovery on B, and B is
    lost too before it ran it. The intermediate Paused is the recovery's (recovery pending), not dormancy: with
    no further demand the recovery goes on to the third node, the file is there, and the flags clear."""
    from adx.coordinator import _lifecycle

    # The real grace (120 s) outlasts any pause of a live node; this cluster's nodes are lost for good.
    monkeypatch.setattr(_lifecycle, "RESUME_TARGET_LOST_SECONDS", 3.0)
    nc = await node_cluster(nodes=("n1", "n2", "n3"), shared_checkpoints=True, session_ttl=2.0)
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    cache = nc.cluster.coordinator.service.cache
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(
            cpu=0.25, memory="256Mi", pause=adx.PausePolicy(storage=adx.CheckpointStorage.SHARED)
        )
        first = env.node
        await env.files.write("/work/travel.txt", b"from " + first.encode())
        await env.pause()
        # The first node to take the resume over hangs before its restore reaches the runtime, and is lost.
        taken: list[str] = []
        hung = asyncio.Event()
        for name, agent in nc.nodes.items():
            if name == first:
                continue
            real_restore = agent.driver.restore

            async def restore(*args: Any, _name: str = name, _real: Any = real_restore, **kwargs: Any) -> Any:
                taken.append(_name)
                if len(taken) == 1:
                    hung.set()
                    await asyncio.Event().wait()  # never reaches sandboxd
                return await _real(*args, **kwargs)

            agent.driver.restore = restore  # type: ignore[method-assign]
        await nc.nodes[first].stop()
        await eventually(lambda: cache.environments[env.id].ownership_lost, 20)
        demand = asyncio.create_task(env.resume())  # the one demand; nothing asks again afterwards
        await asyncio.wait_for(hung.wait(), 30)
        lost_target = taken[0]
        assert cache.environments[env.id].recovery_pending
        await nc.nodes[lost_target].stop()
        survivor = ({"n1", "n2", "n3"} - {first, lost_target}).pop()
        # The recovery goes on from the intermediate Paused (recovery pending) by itself.
        await eventually(lambda: cache.environments[env.id].node == survivor, 60)
        await eventually(lambda: cache.environments[env.id].state is EnvironmentState.RUNNING, 60)
        with contextlib.suppress(adx.AdxError):
            await asyncio.wait_for(demand, 30)
        await env.refresh()
        assert (env.state, env.node) == ("running", survivor)
        assert await env.files.read("/work/travel.txt") == b"from " + first.encode()
        final = cache.environments[env.id]
        assert not final.recovery_pending and not final.ownership_lost
        assert taken == [lost_target, survivor]


@pytest.mark.req("ENV-3")
async def test_shared_storage_is_refused_without_a_node_that_has_it(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        with pytest.raises(adx.AdxError, match="no shared checkpoint storage"):
            await client.environments.create(
                cpu=0.25, memory="256Mi", pause=adx.PausePolicy(storage=adx.CheckpointStorage.SHARED)
            )


@pytest.mark.req("ENV-3", "CRD-8", "CRD-9")
async def test_ttl_expiry_deletes_checkpoint_and_environment_forever_keeps_them(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        short = await client.environments.create(
            cpu=0.25, memory="256Mi", pause=adx.PausePolicy(retention=adx.Retention.ttl(2))
        )
        kept = await client.environments.create(
            cpu=0.25, memory="256Mi", pause=adx.PausePolicy(retention=adx.Retention.forever())
        )
        await short.pause()
        await kept.pause()
        short_ckpt, kept_ckpt = short.checkpoint.id, kept.checkpoint.id
        root = root_of(short.checkpoint)
        assert {short_ckpt, kept_ckpt} <= artifacts(root)
        await wait_state(short, "deleted", within=15)
        await eventually(lambda: short_ckpt not in artifacts(root))
        assert (await kept.refresh()).state == "paused"
        assert kept_ckpt in artifacts(root)
        # An explicit delete of a paused Environment retires its checkpoint too.
        await kept.delete()
        assert kept.state == "deleted"
        await eventually(lambda: kept_ckpt not in artifacts(root))


@pytest.mark.req("CRD-8", "CRD-9")
async def test_delete_racing_a_resume_never_leaves_it_running(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        for delay in (0.0, 0.05, 0.15):
            env = await client.environments.create(cpu=0.25, memory="256Mi")
            await env.pause()
            root, checkpoint = root_of(env.checkpoint), env.checkpoint.id

            async def resume(target: adx.AsyncEnvironment = env) -> None:
                with contextlib.suppress(adx.AdxError):  # losing the race to the delete is a fine outcome
                    await target.resume()

            async def delete(target: adx.AsyncEnvironment = env, after: float = delay) -> None:
                await asyncio.sleep(after)
                await client.environments.delete(target.id)

            await asyncio.gather(resume(), delete())
            await wait_state(env, "deleted", within=20)
            # Whatever won, nothing of it runs and its checkpoint is gone once unreferenced.
            deadline = time.monotonic() + 15
            while env.id in {s.metadata.get("adx.env") for s in await nc.nodes["n1"].driver.client.list()}:
                assert time.monotonic() < deadline, "a sandbox of the deleted Environment is left"
                await asyncio.sleep(0.1)
            await eventually(lambda ckpt=checkpoint, where=root: ckpt not in artifacts(where))


@pytest.mark.req("NOD-1", "NOD-15", "CTL-6", "ENV-3")
async def test_an_adxlet_stopped_mid_pause_recovers_without_losing_anything(node_cluster, api_for) -> None:
    """The adxlet goes away during the capture of a pause (its tasks cancelled mid-call); its successor finds
    the Environment pausing with its execution frozen, and brings it back running (no pause was published).
    The capture sandboxd finished meanwhile is referenced by nothing: the successor's startup sweep deletes it."""
    from adx.node._agent import NodeAgent

    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.5, memory="512Mi")
        await env.commands.run("head -c 67108864 /dev/urandom > /work/blob && sha256sum /work/blob > /work/sum")
        pausing = asyncio.create_task(env.pause())
        deadline = time.monotonic() + 10
        while nc.cluster.coordinator.service.cache.environments[env.id].state is not S.PAUSING:
            assert time.monotonic() < deadline, "the pause did not start"
            await asyncio.sleep(0.005)
        local = nc.sandboxds["n1"].state_dir / "checkpoints"
        await eventually(lambda: any(p.name.startswith(".capturing-") for p in local.iterdir()), 10)
        agent = nc.nodes["n1"]
        await agent.controllers[env.id].close()  # its task is cancelled mid-capture, as in a crash
        await agent.stop()
        with contextlib.suppress(adx.AdxError):
            await pausing
        await eventually(lambda: len(artifacts(local)) == 1, 10)  # sandboxd finished the capture: an orphan
        successor = NodeAgent(agent.config)
        await successor.start()
        nc.nodes["n1"] = successor
        try:
            final = await wait_state(env, "running", within=30)
            assert final.execution_id is not None and final.checkpoint is None  # no pause was published
            assert artifacts(local) == set()
            check = await env.commands.run("sha256sum -c /work/sum")
            assert check.exit_code == 0, check
            await env.pause()  # and a pause after the recovery works
            assert artifacts(local) == {env.checkpoint.id}
            await successor.stop()  # the next startup sweep keeps the artifact the paused Environment references
            successor = NodeAgent(agent.config)
            await successor.start()
            nc.nodes["n1"] = successor
            assert artifacts(local) == {env.checkpoint.id}
            assert (await env.commands.run("sha256sum -c /work/sum")).exit_code == 0
        finally:
            await successor.stop()


@pytest.mark.req("NOD-15", "CRD-9")
async def test_the_sweep_deletes_only_on_the_coordinators_complete_reference_list(node_cluster, api_for) -> None:
    """An artifact nothing references (captured, never committed) is deleted by the sweep, a referenced one
    is kept, and without a reference list from the Coordinator (an older one) nothing is deleted."""
    from adx.runtime._sandboxd import _ref

    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    agent = nc.nodes["n1"]
    local = nc.sandboxds["n1"].state_dir / "checkpoints"
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        paused = await client.environments.create(cpu=0.25, memory="128Mi")
        await paused.pause()
        running = await client.environments.create(cpu=0.25, memory="128Mi")
        orphan = await agent.driver.client.checkpoint(_ref(agent.controllers[running.id].execution))
        assert artifacts(local) == {paused.checkpoint.id, orphan.checkpoint_id}

        agent.sink.referenced_checkpoints = None  # what a Coordinator without reference lists leaves
        await agent._sweep_checkpoints()
        assert artifacts(local) == {paused.checkpoint.id, orphan.checkpoint_id}

        await agent.sink.catalog(with_references=True)
        await agent._sweep_checkpoints()
        assert artifacts(local) == {paused.checkpoint.id}
        await paused.resume()
        assert (await paused.commands.run("true")).exit_code == 0


@pytest.mark.req("CRD-7", "NOD-1")
async def test_an_adxlet_stopped_mid_resume_cleans_the_half_restore_before_resuming(node_cluster, api_for) -> None:
    """The adxlet goes away while sandboxd restores a checkpoint (the restore's reply is never seen). Its
    successor finds the Environment resuming: the half-restored sandbox, recorded before the call, is deleted
    first, then the resume runs again. One sandbox is left for the Environment, and nothing is lost."""
    from adx.node._agent import NodeAgent

    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    agent = nc.nodes["n1"]
    sandboxd = agent.driver.client
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.5, memory="512Mi")
        await env.commands.run("head -c 67108864 /dev/urandom > /work/blob && sha256sum /work/blob > /work/sum")
        await env.pause()
        paused_execution = env.execution_id

        async def sandboxes() -> set[str]:
            return {s.sandbox_id for s in await sandboxd.list() if s.metadata.get("adx.env") == env.id}

        assert await sandboxes() == set()
        resuming = asyncio.create_task(env.resume())
        deadline = time.monotonic() + 10
        while not await sandboxes():
            assert time.monotonic() < deadline, "the restore did not start"
            await asyncio.sleep(0.005)
        (half_restored,) = await sandboxes()
        await agent.controllers[env.id].close()  # its task is cancelled mid-restore, as in a crash
        await agent.stop()
        successor = NodeAgent(agent.config)
        await successor.start()
        nc.nodes["n1"] = successor
        try:
            with contextlib.suppress(adx.AdxError):
                await resuming
            final = await wait_state(env, "running", within=30)
            assert final.execution_id not in (None, paused_execution, half_restored)
            assert await sandboxes() == {final.execution_id}  # the half-restored one is gone
            assert (await env.commands.run("sha256sum -c /work/sum")).exit_code == 0
        finally:
            await successor.stop()


@pytest.mark.req("CRD-7", "RST-7", "NOD-1")
async def test_an_adxlet_stopped_mid_start_goes_on_with_the_same_execution(node_cluster, api_for) -> None:
    """The adxlet goes away while sandboxd creates the first execution (sandboxd is held with SIGSTOP so the
    create is in flight). A node crash is an infrastructure blip, not a failed start (issue 12: it never fails a
    user's create): the successor sends the same create again (same execution ID and secret), the runtime
    answers with what it made, and the Environment runs on exactly one sandbox, without a restart (RST-7: no
    restart, no second execution)."""
    import os

    from adx.node._agent import NodeAgent

    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    agent = nc.nodes["n1"]
    executions = agent.config.state_dir / "executions"
    sandboxd_pid = nc.sandboxds["n1"].proc.pid
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(
            cpu=0.25, memory="128Mi", restart=adx.RestartPolicy(max_retries=2, initial_backoff_seconds=0.1), wait=False
        )
        deadline = time.monotonic() + 10
        while not any(executions.glob("*.json")):  # the planned address is recorded before the create call
            assert time.monotonic() < deadline, "the start did not begin"
            await asyncio.sleep(0.001)
        planned = next(executions.glob("*.json")).stem
        os.kill(sandboxd_pid, signal.SIGSTOP)
        try:
            await agent.controllers[env.id].close()  # cancelled mid-create, as in a crash
            await agent.stop()
        finally:
            os.kill(sandboxd_pid, signal.SIGCONT)
        successor = NodeAgent(agent.config)
        await successor.start()
        nc.nodes["n1"] = successor
        try:
            final = await wait_state(env, "running", within=30)
            assert final.restart_attempts == 0 and final.execution_id == planned
            left = [s.sandbox_id for s in await successor.driver.client.list() if s.metadata.get("adx.env") == env.id]
            assert left == [planned], left
            assert (await env.commands.run("echo up")).stdout == "up\n"
        finally:
            await successor.stop()


@pytest.mark.req("CRD-5")
async def test_no_capacity_on_the_original_node_resumes_a_shared_checkpoint_elsewhere(
    node_cluster, api_for, tmp_path
) -> None:
    nc = await node_cluster(nodes=("n1", "n2"), shared_checkpoints=True)
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(
            cpu=0.25, memory="256Mi", pause=adx.PausePolicy(storage=adx.CheckpointStorage.SHARED)
        )
        original = env.node
        other = "n2" if original == "n1" else "n1"
        await env.files.write("/work/f", b"moved")
        await env.pause()
        # The original node shrinks below the request: it refuses the reservation (explicit NoCapacity).
        (tmp_path / f"{original}-capacity.json").write_text('{"cpuMillis": 100, "memoryBytes": 1048576}')
        cache = nc.cluster.coordinator.service.cache
        await eventually(lambda: cache.nodes[original].capacity.cpu_millis == 100, 10)
        await env.resume()
        assert env.state == "running" and env.node == other
        assert await env.files.read("/work/f") == b"moved"
        # And a local checkpoint never moves: with no room on its node the resume is refused, clearly.
        local = await client.environments.create(cpu=0.25, memory="256Mi")
        await local.pause()
        (tmp_path / f"{local.node}-capacity.json").write_text('{"cpuMillis": 100, "memoryBytes": 1048576}')
        await eventually(lambda: cache.nodes[local.node].capacity.cpu_millis == 100, 10)
        with pytest.raises(adx.AdxError, match="no node can resume"):
            await local.resume()
        assert (await local.refresh()).state == "paused"


@pytest.mark.req("CRD-5")
async def test_a_resume_every_node_refused_is_asked_again_by_one_capacity_round(
    node_cluster, api_for, tmp_path
) -> None:
    """No node has room: the caller gets no_capacity with the round's retry-after (body and Retry-After header),
    callers meanwhile are told the round is due, ownership never moves, and once room is back the capacity round
    resumes the Environment on its node without anyone asking again."""
    nc = await node_cluster(resume_retry=3.0)
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    cache = nc.cluster.coordinator.service.cache
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi")
        await env.files.write("/work/f", b"kept")
        await env.pause()
        capacity = tmp_path / "n1-capacity.json"
        roomy = capacity.read_text()
        capacity.write_text('{"cpuMillis": 100, "memoryBytes": 1048576}')
        await eventually(lambda: cache.nodes["n1"].capacity.cpu_millis == 100, 10)
        async with stack.http(key) as http:
            refused = await http.post(f"/v1/environments/{env.id}/resume")
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "no_capacity", refused.text
            assert refused.json()["error"]["details"]["retry_after_seconds"] == 3.0
            assert refused.headers["Retry-After"] == "3"
            again = await http.post(f"/v1/environments/{env.id}/resume")
            assert again.status_code == 503 and "capacity round is due" in again.json()["error"]["message"]
        record = cache.environments[env.id]
        assert record.state is S.PAUSED and record.node == "n1" and record.resume_intent is None
        capacity.write_text(roomy)
        await wait_state(env, "running", within=20)
        assert env.node == "n1"
        assert await env.files.read("/work/f") == b"kept"


@pytest.mark.req("ENV-6", "NOD-7", "CTL-6")
async def test_a_pause_whose_commit_cannot_be_stored_is_never_reported_as_done(node_cluster, api_for) -> None:
    """Redis dies during the capture: the node's result cannot be published; the public pause answers
    'temporarily unavailable: cluster publication pending', and the result is committed once Redis is back."""
    nc = await node_cluster(redis_timeout=1.0)
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.5, memory="512Mi")
        await env.commands.run("head -c 67108864 /dev/urandom > /work/blob && sha256sum /work/blob > /work/sum")
        async with stack.http(key) as http:
            pausing = asyncio.create_task(http.post(f"/v1/environments/{env.id}/pause"))
            deadline = time.monotonic() + 10
            while nc.cluster.coordinator.service.cache.environments[env.id].state is not S.PAUSING:
                assert time.monotonic() < deadline, "the pause did not start"
                await asyncio.sleep(0.005)
            nc.cluster.redis.send_signal(signal.SIGKILL)
            nc.cluster.redis.wait_exited()
            answer = await pausing
        assert answer.status_code == 503, answer.text
        assert "cluster publication pending" in answer.text
        nc.cluster.redis.start()
        await wait_state(env, "paused", within=60)
        assert (await env.commands.run("sha256sum -c /work/sum")).exit_code == 0
