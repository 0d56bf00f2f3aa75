"""A journaled pause whose replay is dropped because the Coordinator took a delete meanwhile (NOD-10, NOD-11,
JRN-5, CTL-6), on real parts: a Coordinator process and an adxlet process held by SIGSTOP, real Redis, real
sandboxd and sandboxes, the adxlet's real SQLite journal.

Found by the fault soak (seed 3): an idle pause journaled while Redis was stopped (running -> pausing ->
paused, local revision R+2); the Coordinator then accepted the tenant's delete (deleting at R+1); the replay
dropped both entries, but the Controller kept its dropped record at R+2 as its own, so the queued delete's
commit was refused as stale and nothing retried it: the Environment stayed `deleting` forever, its reservation
held, and the dropped pause's checkpoint was referenced by nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from process_cluster import ProcessCluster, record_of, wait_for
from test_journal import api_of, journal_rows, node_registered, sandbox_ids
from test_node_agent import Api

from adx._node_client import NodeClients
from adx.config import NodeConfig
from adx.config._base import load_model
from adx.errors import PublicationPendingError, UnavailableError
from adx.model import EnvironmentRecord, EnvironmentState
from adx.node._agent import NodeAgent
from adx.node._operations import Pause
from adx.proto import coordinator_pb2 as pb
from adx.runtime import Execution, InventoryItem

S = EnvironmentState


async def reservations(cluster: ProcessCluster, node: str = "n1") -> dict[str, Any]:
    """The node's reservation entries as Redis holds them (env id -> amounts)."""
    info = cluster.redis.read_info()
    assert info is not None
    client = aioredis.Redis.from_url(info.url, decode_responses=True)
    try:
        return dict(await client.hgetall(f"adx:node-res:{node}"))
    finally:
        await client.aclose()


async def checkpoint_ids(cluster: ProcessCluster, node: str = "n1") -> set[str]:
    listing = await cluster.nodes[node].sandboxd.client().list_checkpoints("local")
    return {c.checkpoint_id for c in listing.checkpoints}


@dataclass
class Outage:
    """The process cluster and the API's and Coordinator's clients of one test."""

    cluster: ProcessCluster
    api: Api
    nodes: NodeClients


@pytest.fixture
async def outage(process_cluster: Any) -> AsyncIterator[Outage]:
    cluster: ProcessCluster = process_cluster()
    api = api_of(cluster)
    nodes = cluster.node_clients(rpc_timeout=30)
    try:
        yield Outage(cluster, api, nodes)
    finally:
        await nodes.close()
        await api.close()


async def pause_journaled(outage: Outage) -> tuple[EnvironmentRecord, str]:
    """A running Environment with a file in /work, paused straight at its node while the Coordinator is
    SIGSTOPped (left stopped): (its running record at revision R, the pause's checkpoint ID). The pause is
    journaled (pausing R+1, paused R+2), its execution cleaned, its artifact referenced only by the journal."""
    cluster, api, nodes = outage.cluster, outage.api, outage.nodes
    await node_registered(api)
    created = await api.create()
    running = await api.wait_state(created.id, S.RUNNING)
    assert created.id in await reservations(cluster)
    status, _, body = await cluster.run("n1", created.id, ["sh", "-c", "echo kept-data > /work/f"])
    assert status == 200, body
    cluster.coordinator.freeze()
    with pytest.raises(PublicationPendingError):
        await nodes.pause(cluster.nodes["n1"].listen, running, wait_seconds=30)
    base = running.revision
    assert journal_rows(cluster.nodes["n1"].journal) == [
        (created.id, "pausing", base + 1),
        (created.id, "paused", base + 2),
    ]
    assert running.execution_id not in await sandbox_ids(cluster)
    [checkpoint] = await checkpoint_ids(cluster)
    return running, checkpoint


@asynccontextmanager
async def adxlet_held(cluster: ProcessCluster) -> AsyncIterator[None]:
    """The Coordinator back while the adxlet is SIGSTOPped: what the block makes the Coordinator accept lands
    before the adxlet can replay (a node hand-over meanwhile times out; its intent stays committed)."""
    adxlet = cluster.nodes["n1"].adxlet
    adxlet.freeze()
    try:
        cluster.coordinator.thaw()
        yield
    finally:
        adxlet.thaw()


@pytest.mark.req("NOD-10", "NOD-11", "NOD-12", "JRN-3", "JRN-5", "CTL-6")
@pytest.mark.parametrize("delete_on_node", ["after the replay", "journaled behind the pause"])
async def test_a_delete_accepted_while_a_pause_was_journaled_ends_deleted_after_the_replay_drops_it(
    outage: Outage, delete_on_node: str
) -> None:
    """The pause is journaled while the Coordinator is SIGSTOPped; the Coordinator, back while the adxlet is
    held, accepts the delete (deleting at R+1), so the replay that follows meets it and drops the entries.

    "after the replay": the Coordinator stays up, so the node's replay and the Coordinator's late hand-over race
    as in the soak; a delete that comes after the replay (the routine check's) meets a Controller whose local
    record (R+2) was past the Coordinator's. "journaled behind the pause": the Coordinator is held again and the
    hand-over reaches the node first, so the node's delete is journaled behind the pause (JRN-3) and dropped
    with it. Either way the Environment must end deleted (gone
    from Redis, or `deleted`), its reservation released, its sandbox gone and the dropped pause's checkpoint
    deleted from sandboxd's storage."""
    cluster = outage.cluster
    journal = cluster.nodes["n1"].journal
    running, _ = await pause_journaled(outage)
    async with adxlet_held(cluster):
        deleting = await outage.api.delete(running.id)
        assert deleting.state is S.DELETING
        if delete_on_node != "after the replay":
            cluster.coordinator.freeze()
    if delete_on_node != "after the replay":
        await outage.nodes.delete(cluster.nodes["n1"].listen, deleting)
        await wait_for(lambda: len(journal_rows(journal)) == 4, 30, "the delete journaled behind the pause")
        assert [row[1] for row in journal_rows(journal)] == ["pausing", "paused", "deleting", "deleted"]
        cluster.coordinator.thaw()
    await ends_deleted(cluster, running)


async def ends_deleted(cluster: ProcessCluster, running: EnvironmentRecord) -> None:
    """The Environment ends deleted (gone from Redis, or `deleted`) with the journal emptied, its reservation
    released, its sandbox gone and no checkpoint left in sandboxd's storage (the dropped pause's deleted)."""

    async def deleted() -> bool:
        record = record_of(await cluster.redis_record(running.id))
        return record is None or record.state is S.DELETED

    async def no_checkpoints() -> bool:
        return not await checkpoint_ids(cluster)

    await wait_for(deleted, 60, "the Environment to end deleted after the dropped replay", interval=0.3)
    await wait_for(lambda: not cluster.nodes["n1"].journal.exists(), 30, "the journal to be emptied")
    assert running.id not in await reservations(cluster)
    assert running.execution_id not in await sandbox_ids(cluster)
    await wait_for(no_checkpoints, 30, "the dropped pause's checkpoint deleted")


@pytest.mark.req("NOD-10", "NOD-11", "ENV-4")
async def test_a_pause_dropped_for_a_spec_change_is_published_again_and_wakes_from_its_checkpoint(
    outage: Outage,
) -> None:
    """The same outage, but the Coordinator takes a spec change meanwhile (a lifetime with its action: a new
    spec, still running at R+1), so the replay drops the pause as "the request spec changed". The pause really
    happened here (the execution is gone, its checkpoint kept): the Controller adopts the Coordinator's record
    and publishes the pause again on it, so the Environment is paused on that checkpoint with its reservation
    released, not running on paper with no execution. A wake (EnsureRunning) then resumes it from the
    checkpoint with the file written before the pause; its old execution is never back."""
    cluster, api = outage.cluster, outage.api
    running, checkpoint = await pause_journaled(outage)
    async with adxlet_held(cluster):
        lifetime = pb.SetLifetimeRequest(tenant="acme", environment_id=running.id, seconds=3600, action="pause")
        changed = await api.call("set lifetime", api.stub.SetLifetime(lifetime))
        assert EnvironmentRecord.model_validate_json(changed.environment_json).state is S.RUNNING

    await ends_paused_on(outage, running, checkpoint)
    await wakes_with_its_file(outage, running)


async def ends_paused_on(outage: Outage, running: EnvironmentRecord, checkpoint: str) -> None:
    """The Environment ends paused on the dropped pause's checkpoint, same generation, its reservation
    released, its old sandbox gone and the journal emptied."""
    cluster = outage.cluster
    paused = await outage.api.wait_state(running.id, S.PAUSED, within=60)
    assert paused.checkpoint is not None and paused.checkpoint.id == checkpoint
    assert paused.execution_id is None and paused.generation == running.generation
    await wait_for(lambda: not cluster.nodes["n1"].journal.exists(), 30, "the journal to be emptied")
    assert running.id not in await reservations(cluster)

    async def old_sandbox_gone() -> bool:
        # The pause published again comes first, its execution's cleanup right after it (_converge).
        return running.execution_id not in await sandbox_ids(cluster)

    await wait_for(old_sandbox_gone, 30, "the paused execution's sandbox to be cleaned")


async def wakes_with_its_file(outage: Outage, running: EnvironmentRecord) -> None:
    """A wake (EnsureRunning) resumes it from the checkpoint on a new execution, with the file written before
    the pause, its resources reserved again."""
    api = outage.api
    wake = pb.EnsureRunningRequest(tenant="acme", environment_id=running.id, timeout_seconds=60)
    await api.call("ensure running", api.stub.EnsureRunning(wake))
    resumed = await api.wait_state(running.id, S.RUNNING, within=60)
    assert resumed.execution_id not in (None, running.execution_id)
    status, stdout, body = await outage.cluster.run_when_served("n1", running.id, ["cat", "/work/f"])
    assert (status, stdout) == (200, "kept-data\n"), body
    assert running.id in await reservations(outage.cluster)


async def restarted_after(outage: Outage, change: str, times: int = 1, *, restart: bool = True) -> EnvironmentRecord:
    """The pause journaled (Coordinator SIGSTOPped), then the adxlet SIGSTOPped and the Coordinator back to take
    ``change`` ("delete", or "spec" ``times`` times: a lifetime with its action, so the record stays running on a
    new spec); then the adxlet SIGKILLed and started again: its journal is replayed by the startup barrier
    (JRN-6), before any Controller exists, and the replay drops the pause. Returns the Coordinator's record after
    the change."""
    cluster, api = outage.cluster, outage.api
    running, _ = await pause_journaled(outage)
    adxlet = cluster.nodes["n1"].adxlet
    adxlet.freeze()
    cluster.coordinator.thaw()
    if change == "delete":
        changed = await api.delete(running.id)
        assert changed.state is S.DELETING
    else:
        for seconds in range(3600, 3600 + times):
            lifetime = pb.SetLifetimeRequest(tenant="acme", environment_id=running.id, seconds=seconds, action="pause")
            reply = await api.call("set lifetime", api.stub.SetLifetime(lifetime))
            changed = EnvironmentRecord.model_validate_json(reply.environment_json)
        assert changed.state is S.RUNNING and changed.spec != running.spec
        assert changed.revision == running.revision + times
    adxlet.kill()  # SIGKILL while stopped: nothing more of this process runs
    assert [row[1] for row in journal_rows(cluster.nodes["n1"].journal)] == ["pausing", "paused"]
    if restart:
        adxlet.start()
    return changed


@pytest.mark.req("NOD-1", "NOD-10", "NOD-11", "NOD-15", "JRN-5", "JRN-6", "CTL-6", "ENV-4")
@pytest.mark.parametrize("changes", [1, 2])
async def test_a_pause_dropped_by_the_startup_replay_is_published_again_not_swept(outage: Outage, changes: int) -> None:
    """The startup replay of a restarted adxlet drops the journaled pause (the request spec changed meanwhile,
    ``changes`` times) while the Coordinator still shows the Environment running on an execution that no longer
    exists. The pause really happened (its execution is gone, its checkpoint holds the files): the startup
    barrier converges as the Controller does at runtime, so the pause is published again on the Coordinator's
    record and the checkpoint sweep (NOD-15) leaves its checkpoint alone.

    Before the fix the barrier took every entry at or below the catalog's revision as committed: with two
    changes (R+2) both entries were forgotten unreplayed, the Environment stayed `running` with no execution and
    the sweep deleted the only copy of its files; with one (R+1) the `paused` entry was committed on the changed
    record without the replay ever judging the spec."""
    cluster, api = outage.cluster, outage.api
    running = await api.get((await restarted_after(outage, "spec", changes)).id)
    [checkpoint] = await checkpoint_ids(cluster)

    await ends_paused_on(outage, running, checkpoint)
    assert await checkpoint_ids(cluster) == {checkpoint}  # kept, and no other artifact left behind
    # Judged by the replay (the spec), not committed over the Coordinator's change nor forgotten by revision.
    assert "journaled results dropped" in cluster.nodes["n1"].adxlet.log_text()
    await wakes_with_its_file(outage, running)


@pytest.mark.req("NOD-1", "NOD-11", "NOD-12", "NOD-15", "JRN-5", "JRN-6")
async def test_a_delete_accepted_while_a_pause_was_journaled_ends_deleted_after_a_restart(outage: Outage) -> None:
    """The delete-meanwhile variant at restart: the startup replay drops the pause against the `deleting`
    record; the Environment ends deleted, its reservation released, its sandbox gone, the dropped pause's
    checkpoint deleted and the journal emptied."""
    await ends_deleted(outage.cluster, await restarted_after(outage, "delete"))


@pytest.mark.req("NOD-1", "NOD-10", "NOD-15", "JRN-6")
async def test_a_dropped_pause_is_decided_only_once_the_runtime_inventory_can_be_read(outage: Outage) -> None:
    """The spec-change outage at restart, but the restarted adxlet (run in this test process on the same
    configuration, so its runtime's inventory call can be made to fail: fault injection) cannot read the runtime's
    inventory: the record names an execution this node has no file for, which the runtime might still hold
    (a file lost with a damaged state directory). Nothing is decided while it cannot: the record stays as the
    Coordinator holds it, the checkpoint sweep keeps the dropped pause's checkpoint, and no Controller acts on it.
    Once the inventory answers, the routine check recovers it and it ends paused on that checkpoint."""
    cluster = outage.cluster
    changed = await restarted_after(outage, "spec", restart=False)
    [checkpoint] = await checkpoint_ids(cluster)
    agent = NodeAgent(load_model(NodeConfig, "node", cluster.nodes["n1"].adxlet.config, environ={}))
    readable = asyncio.Event()
    refused = 0
    real_inventory = agent.driver.inventory

    async def inventory() -> list[InventoryItem]:
        nonlocal refused
        if not readable.is_set():
            refused += 1
            raise UnavailableError("injected: the runtime's inventory cannot be read")
        return await real_inventory()

    agent.driver.inventory = inventory  # type: ignore[method-assign]
    await agent.start()
    try:
        # start() returned: the barrier (its take-over and the recovery) is over; then three routine checks'
        # rounds (0.5 s each) in which nothing may happen.
        await asyncio.sleep(1.5)
        held = record_of(await cluster.redis_record(changed.id))
        assert held is not None and (held.state, held.revision) == (S.RUNNING, changed.revision)
        assert changed.id not in agent.controllers
        assert await checkpoint_ids(cluster) == {checkpoint}
        assert [row[1] for row in journal_rows(cluster.nodes["n1"].journal)] == []
        assert refused >= 4  # the barrier's take-over and recovery, then each routine check's recovery
        readable.set()
        await ends_paused_on(outage, changed, checkpoint)
        assert await checkpoint_ids(cluster) == {checkpoint}
    finally:
        await agent.stop()


@pytest.mark.req("NOD-10", "NOD-11", "RST-1", "JRN-5")
async def test_an_exit_dropped_for_a_spec_change_goes_through_the_exit_flow_again(outage: Outage) -> None:
    """The convergence's exit-flow branch: the workload exits while the Coordinator is SIGSTOPped, so its
    `failed` result (no restart policy: final, reservation released) is journaled and its sandbox cleaned; the
    Coordinator, back while the adxlet is held, takes a spec change (still running on the ended execution), so
    the replay drops the exit. The Controller adopts the record, which names an execution that no longer exists
    here: the exit flow runs again on it and the Environment ends failed, its reservation released, never
    `running` on paper with nothing behind it."""
    cluster, api = outage.cluster, outage.api
    await node_registered(api)
    wait_then_exit = "while [ ! -e /work/stop ]; do sleep 0.1; done; exit 3"
    created = await api.create(entrypoint=["sh", "-c", wait_then_exit])
    running = await api.wait_state(created.id, S.RUNNING)
    cluster.coordinator.freeze()
    status, _, body = await cluster.run("n1", created.id, ["touch", "/work/stop"])
    assert status == 200, body
    journal = cluster.nodes["n1"].journal
    await wait_for(lambda: journal_rows(journal) == [(created.id, "failed", running.revision + 1)], 30, "the exit")
    async with adxlet_held(cluster):
        lifetime = pb.SetLifetimeRequest(tenant="acme", environment_id=created.id, seconds=3600, action="pause")
        await api.call("set lifetime", api.stub.SetLifetime(lifetime))

    failed = await api.wait_state(created.id, S.FAILED, within=60)
    assert failed.execution_id == running.execution_id and not failed.restart_pending
    assert "while the Coordinator was away" in (failed.last_error or ""), failed.last_error
    await wait_for(lambda: not journal.exists(), 30, "the journal to be emptied")
    assert created.id not in await reservations(cluster)
    assert running.execution_id not in await sandbox_ids(cluster)


@pytest.mark.req("NOD-1", "NOD-10", "NOD-11", "NOD-13", "JRN-6", "CTL-6")
async def test_a_dropped_pause_whose_cleanup_was_cut_short_is_published_again_at_restart(outage: Outage) -> None:
    """The adxlet is stopped after its pause was journaled (`pausing`, `paused`: the checkpoint captured) but
    before the paused execution's cleanup was confirmed (fault injection: the runtime's stop of that execution
    never returns in the first adxlet, run in this test process on the cluster's configuration), so the
    execution's file is still here. The Coordinator takes a spec change meanwhile and the successor's startup
    replay drops the pause. The pause is still the truth (the checkpoint holds the files; the execution was
    frozen for it): it is published again and the execution cleaned, never the checkpoint deleted while the
    execution is adopted, thawed or failed."""
    cluster, api = outage.cluster, outage.api
    config = load_model(NodeConfig, "node", cluster.nodes["n1"].adxlet.config, environ={})
    cluster.nodes["n1"].adxlet.kill()
    first = NodeAgent(config)
    cut_short: set[str] = set()
    real_stop = first.driver.stop

    async def stop(execution: Execution) -> None:
        if execution.execution_id in cut_short:
            await asyncio.Event().wait()  # the cleanup never confirmed: cancelled by the adxlet's stop
        await real_stop(execution)

    first.driver.stop = stop  # type: ignore[method-assign]
    await first.start()
    successor: NodeAgent | None = None
    try:
        await node_registered(api)
        created = await api.create()
        running = await api.wait_state(created.id, S.RUNNING)
        assert running.execution_id is not None
        status, _, body = await cluster.run("n1", created.id, ["sh", "-c", "echo kept-data > /work/f"])
        assert status == 200, body
        cut_short.add(running.execution_id)
        cluster.coordinator.freeze()
        first.controllers[created.id].submit(Pause())
        journal = cluster.nodes["n1"].journal
        await wait_for(lambda: [r[1] for r in journal_rows(journal)] == ["pausing", "paused"], 30, "the pause")
        await first.stop()
        assert first.executions.get(running.execution_id) is not None  # its cleanup was never confirmed
        [checkpoint] = await checkpoint_ids(cluster)
        cluster.coordinator.thaw()
        lifetime = pb.SetLifetimeRequest(tenant="acme", environment_id=created.id, seconds=3600, action="pause")
        await api.call("set lifetime", api.stub.SetLifetime(lifetime))

        successor = NodeAgent(config)
        await successor.start()
        await ends_paused_on(outage, running, checkpoint)
        assert await checkpoint_ids(cluster) == {checkpoint}
        assert successor.executions.get(running.execution_id) is None
        await wakes_with_its_file(outage, running)
    finally:
        if successor is not None:
            await successor.stop()
        elif not first.stop_event.is_set():
            await first.stop()
