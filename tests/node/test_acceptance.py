"""The node's acceptance scenarios of the seed documents, one test each, named after it, on real parts.

Seed 000 (real-runtime fault cases): a backend execution deleted out of band restarts with a new execution
identity; the Coordinator paused during an idle delete (SQLite, Redis keeps the old state); the adxlet restarted
meanwhile waits for the Coordinator and keeps its running instances; the Coordinator back replays the delete and
restores routes, zero pending; the resource source unreachable keeps the last capacity and the ledger.
Seed 001 (component cases): A blocked while B creates, pauses and resumes; an orphan whose delete fails or whose
reply is lost; the node's session recovery.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from process_cluster import ProcessCluster, record_of, wait_for
from test_journal import api_of, journal_rows, node_registered, sandbox_ids
from test_node_agent import Api, run_via_relay
from test_restart_policy import restarting

from adx.errors import AdxError, UnavailableError
from adx.model import EnvironmentRecord, EnvironmentState
from adx.node._operations import Step
from adx.proto import coordinator_pb2 as pb

S = EnvironmentState


@pytest.mark.req("RST-1", "RST-2", "NOD-1")
async def test_backend_execution_deleted_out_of_band_restarts_with_a_new_execution_identity(node_cluster) -> None:
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        created = await api.create(**restarting(max_retries=2, backoff=0.5, script="sleep 3600"))
        first = await api.wait_state(created.id, S.RUNNING)
        execution = agent.executions.get(first.execution_id)
        assert execution is not None
        # Someone deletes the sandbox behind the node's back, straight through sandboxd.
        await agent.driver.stop(execution)

        async def restarted() -> EnvironmentRecord | None:
            record = await api.get(created.id)
            ok = record.state is S.RUNNING and record.execution_id != first.execution_id
            return record if ok else None

        second = await wait_for(restarted, 60, "a restart with a new execution")
        assert (second.generation, second.restart_attempts) == (first.generation, 1)
        assert second.execution_id in {s.sandbox_id for s in await agent.driver.client.list()}
        relay = await api.route(created.id)
        assert await run_via_relay(nc, relay, created.id, ["echo", "back"]) == ("back\n", 0)
    finally:
        await api.close()


@pytest.mark.req("JRN-2", "JRN-4", "JRN-5", "NOD-17", "IDLE-5")
async def test_coordinator_paused_during_an_idle_delete_journals_it_redis_keeps_the_old_state_and_replays_on_return(
    process_cluster,
) -> None:
    """Seed 000: "Coordinator paused: the idle delete goes to SQLite, Redis keeps the old state, no false global
    success" and "Coordinator back: the delete journal replays, existing routes recovered, zero pending"."""
    cluster: ProcessCluster = process_cluster()
    journal = cluster.nodes["n1"].journal
    api = api_of(cluster)
    try:
        await node_registered(api)
        idle = await api.create(lifecycle={"idleTimeoutSeconds": 2})
        busy = await api.create()
        idle_running = await api.wait_state(idle.id, S.RUNNING)
        await api.wait_state(busy.id, S.RUNNING)
        before = await cluster.redis_record(idle.id)

        cluster.coordinator.freeze()
        try:
            await wait_for(
                lambda: "deleted" in {r[1] for r in journal_rows(journal) if r[0] == idle.id},
                30,
                "the idle delete journaled",
            )
            assert idle_running.execution_id not in await sandbox_ids(cluster)
            assert await cluster.redis_record(idle.id) == before  # no false global success
            # The running one keeps serving through its node's Relay meanwhile (JRN-4).
            status, stdout, body = await cluster.run("n1", busy.id, ["echo", "served"])
            assert (status, stdout) == (200, "served\n"), body
        finally:
            cluster.coordinator.thaw()
        await wait_for(lambda: not journal.exists(), 60, "zero pending and the journal removed")
        deleted = record_of(await cluster.redis_record(idle.id))
        assert deleted is None or deleted.state is S.DELETED
        await api.wait_state(busy.id, S.RUNNING)
        status, stdout, body = await cluster.run_when_served("n1", busy.id, ["echo", "routed"])
        assert (status, stdout) == (200, "routed\n"), body
        assert await api.route(busy.id)
    finally:
        await api.close()


@pytest.mark.req("JRN-6", "JRN-7", "NOD-1", "NOD-18")
async def test_adxlet_restarted_while_the_coordinator_is_paused_waits_for_it_and_keeps_running_instances(
    process_cluster,
) -> None:
    cluster: ProcessCluster = process_cluster()
    api = api_of(cluster)
    node = cluster.nodes["n1"]
    try:
        await node_registered(api)
        kept = [await api.create() for _ in range(2)]
        running = [await api.wait_state(env.id, S.RUNNING) for env in kept]
        cluster.coordinator.freeze()
        try:
            sandboxes = await sandbox_ids(cluster)
            node.adxlet.kill()
            node.adxlet.start()
            await asyncio.sleep(6)
            assert node.adxlet.alive()
            assert await sandbox_ids(cluster) == sandboxes  # nothing cleaned or recreated on a missing catalog
            assert "catalog not available yet" in node.adxlet.log.read_text() or "register" in node.adxlet.log_tail()
        finally:
            cluster.coordinator.thaw()
        for record in running:
            same = await api.wait_state(record.id, S.RUNNING)
            assert same.execution_id == record.execution_id
            status, stdout, body = await cluster.run_when_served("n1", record.id, ["echo", "adopted"])
            assert (status, stdout) == (200, "adopted\n"), body
    finally:
        await api.close()


@pytest.mark.req("RES-4", "RES-5", "RES-6")
async def test_resource_source_unreachable_keeps_the_last_capacity_and_the_ledger(node_cluster, tmp_path: Path) -> None:
    """The sample source goes away: the last valid sample is kept until its own validity ends (not renewed),
    reservations are untouched and running instances keep running; once the sample expired admission is closed
    (RES-6 Decision) and it reopens when the source answers again."""
    nc = await node_cluster(capacity_valid_for=4.0)
    api = Api(nc)
    agent = nc.nodes["n1"]
    capacity_file = agent.config.capacity_file
    assert capacity_file is not None
    try:
        env = await api.create()
        running = await api.wait_state(env.id, S.RUNNING)
        sample = agent.reporter.tracker.sample
        assert sample is not None
        store = nc.cluster.coordinator.service.store
        reserved = await store.node_reservations("n1")
        assert env.id in reserved
        saved = capacity_file.read_text()
        capacity_file.unlink()
        await asyncio.sleep(1.5)
        kept = agent.reporter.tracker.sample
        assert kept is not None and kept.capacity == sample.capacity and kept.valid_until == sample.valid_until
        assert agent.reporter.admission_open  # still within the sample's own validity
        await wait_for(lambda: not agent.reporter.admission_open, 10, "admission closed at the sample's expiry")
        assert (await api.get(env.id)).execution_id == running.execution_id
        with pytest.raises(AdxError):
            await api.create()  # nothing is placed on an expired sample
        assert await store.node_reservations("n1") == reserved  # the ledger is untouched (RES-4, RES-5)
        relay = await api.route(env.id)
        assert await run_via_relay(nc, relay, env.id, ["echo", "still"]) == ("still\n", 0)
        capacity_file.write_text(saved)
        await wait_for(lambda: agent.reporter.admission_open, 10, "admission open again")
        # Placement reads the Coordinator's view, which the node's next heartbeat brings (the refused create
        # above also held it closed until that report).
        coordinator = nc.cluster.coordinator.service
        await wait_for(lambda: coordinator.cache.nodes["n1"].admission_open, 10, "the Coordinator sees it open")
        again = await api.create()
        await api.wait_state(again.id, S.RUNNING)
    finally:
        await api.close()


@pytest.mark.req("NOD-4", "CTL-2")
async def test_while_environment_a_is_blocked_b_creates_pauses_and_resumes_and_heartbeats_go_on(node_cluster) -> None:
    """Seed 001: A's backend hangs (its sandbox's processes are stopped, so its pause waits on execd); B is
    created, paused and resumed meanwhile, and the node's heartbeats keep their period."""
    import os
    import signal

    nc = await node_cluster(report_interval=0.5)
    api = Api(nc)
    agent = nc.nodes["n1"]
    daemon = nc.sandboxds["n1"]
    try:
        a = await api.wait_state((await api.create()).id, S.RUNNING)
        assert a.execution_id is not None
        stopped = daemon.cgroup_procs(a.execution_id)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            a_pause = asyncio.create_task(
                api.call(
                    "pause a", api.stub.PauseEnvironment(pb.EnvironmentRequest(tenant="acme", environment_id=a.id))
                )
            )
            await asyncio.sleep(0.3)
            reports_before = agent.reporter.state.reports
            started = time.monotonic()
            b = await api.create()
            await api.wait_state(b.id, S.RUNNING)
            await api.call(
                "pause b", api.stub.PauseEnvironment(pb.EnvironmentRequest(tenant="acme", environment_id=b.id))
            )
            await api.wait_state(b.id, S.PAUSED)
            await api.call(
                "resume b",
                api.stub.EnsureRunning(pb.EnsureRunningRequest(tenant="acme", environment_id=b.id, timeout_seconds=30)),
            )
            await api.wait_state(b.id, S.RUNNING)
            elapsed = time.monotonic() - started
            assert not a_pause.done() or isinstance(a_pause.exception(), AdxError | type(None))
            # Heartbeats kept their period while A was stuck: about one per 0.5 s.
            assert agent.reporter.state.reports - reports_before >= int(elapsed / 0.5) - 2
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        a_pause.cancel()
    finally:
        await api.close()


@pytest.mark.req("NOD-13", "CRD-7", "NOD-1")
async def test_an_orphan_whose_delete_fails_keeps_its_environment_closed_until_the_delete_is_confirmed(
    node_cluster,
) -> None:
    """An execution no committed record references (a start cut short) whose cleanup the runtime refuses: its
    file stays as the persisted cleanup record, that Environment admits nothing, the others are served; the
    next rounds retry and the restriction lifts only once the delete is confirmed."""
    from adx.model import EnvironmentSpec
    from adx.node._agent import NodeAgent
    from adx.runtime import ExecutionSpec

    nc = await node_cluster(report_interval=0.5)
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        spec = EnvironmentSpec.model_validate({"resources": {"cpuMillis": 100, "memoryBytes": 2**27}})
        orphan_spec = ExecutionSpec("env-orphan", 1, "exe-orphan", spec)
        agent.executions.save(agent.driver.planned(orphan_spec))
        orphan = await agent.driver.start(orphan_spec)
        agent.executions.save(orphan)
        await agent.stop()

        successor = NodeAgent(agent.config)
        nc.nodes["n1"] = successor
        real_stop = successor.driver.stop
        refusals = 0

        async def refusing_stop(execution):
            nonlocal refusals
            if execution.execution_id == "exe-orphan" and refusals < 4:
                refusals += 1
                raise UnavailableError("sandboxd: delete failed (injected)")
            await real_stop(execution)

        successor.driver.stop = refusing_stop  # type: ignore[method-assign]
        await successor.start()
        try:
            assert "env-orphan" in successor._orphan_envs()
            assert successor.executions.get("exe-orphan") is not None  # the persisted cleanup record
            with pytest.raises(UnavailableError, match="cleanup is not confirmed"):
                successor.admit(
                    EnvironmentRecord.model_validate(
                        {
                            "id": "env-orphan",
                            "tenant": "acme",
                            "spec": spec.to_wire(),
                            "state": "pending",
                            "node": "n1",
                            "generation": 1,
                            "revision": 1,
                            "createdAt": time.time(),
                            "updatedAt": time.time(),
                        }
                    )
                )
            other = await api.create()  # every other Environment is served meanwhile
            await api.wait_state(other.id, S.RUNNING)
            await wait_for(lambda: "env-orphan" not in successor._orphan_envs(), 30, "the confirmed delete")
            assert refusals == 4
            assert successor.executions.get("exe-orphan") is None
            assert "exe-orphan" not in {s.sandbox_id for s in await successor.driver.client.list()}
        finally:
            successor.driver.stop = real_stop  # type: ignore[method-assign]
    finally:
        await api.close()


@pytest.mark.req("NOD-6", "NOD-1")
async def test_node_session_recovery_after_an_explicit_rejection_retakes_behind_a_barrier(node_cluster) -> None:
    """Another process took the node's session (an explicit rejection): the node registers anew, keeps admission
    closed while it drains, reads the catalog and recovers, then opens it; running instances are untouched."""
    from adx.coordinator._store import CoordinatorStore
    from adx.model import new_id

    nc = await node_cluster(report_interval=0.5)
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        running = await api.wait_state((await api.create()).id, S.RUNNING)
        first_session = agent.reporter.state.session
        store = CoordinatorStore.from_url(nc.cluster.config.redis_url)
        try:
            await store.register_node("n1", session=new_id("ses"), address="elsewhere:1")
        finally:
            await store.close()
        await nc.cluster.coordinator.service._refresh_node("n1")
        closed_seen = False

        def retaken() -> bool:
            nonlocal closed_seen
            closed_seen = closed_seen or agent.reporter.state.retake_pending
            return agent.reporter.state.session != first_session and agent.reporter.admission_open

        await wait_for(retaken, 30, "a new session and admission open again", interval=0.01)
        assert closed_seen
        same = await api.get(running.id)
        assert (same.state, same.execution_id) == (S.RUNNING, running.execution_id)
        relay = await api.route(running.id)
        assert await run_via_relay(nc, relay, running.id, ["echo", "kept"]) == ("kept\n", 0)
        fresh = await api.create()
        await api.wait_state(fresh.id, S.RUNNING)
    finally:
        await api.close()


@pytest.mark.req("NOD-1", "CRD-7", "NOD-7")
async def test_a_start_whose_running_commit_was_cut_short_is_adopted_after_an_adxlet_restart(node_cluster) -> None:
    """Found by the fault soak (seed 3): the start returned but its Running commit never landed (Redis down), then
    the adxlet stopped. The successor found a Starting record with a live execution and crashed at every start
    ('nothing running to adopt'). Now it adopts the execution once ready and commits Running."""
    import os
    import signal

    from adx.node._agent import NodeAgent

    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    redis = nc.cluster.redis
    sandboxd_pid = nc.sandboxds["n1"].proc.pid
    executions = agent.config.state_dir / "executions"
    try:
        created = await api.create()
        await wait_for(lambda: any(executions.glob("*.json")), 10, "the planned execution", interval=0.001)
        os.kill(sandboxd_pid, signal.SIGSTOP)  # the create is in flight
        try:
            await wait_for(lambda: agent.controllers[created.id].state is S.STARTING, 10, "Starting committed")
            redis.send_signal(signal.SIGKILL)
        finally:
            os.kill(sandboxd_pid, signal.SIGCONT)
        controller = agent.controllers[created.id]
        await wait_for(
            lambda: controller.commit_retrying and controller.execution is not None, 30, "a Running commit pending"
        )
        execution_id = controller.execution.execution_id if controller.execution else ""
        await agent.stop()
        await asyncio.to_thread(redis.start)
        successor = NodeAgent(agent.config)
        await successor.start()
        nc.nodes["n1"] = successor
        running = await api.wait_state(created.id, S.RUNNING, within=30)
        assert running.execution_id == execution_id  # adopted, not replaced
        relay = await api.route(created.id)
        assert await run_via_relay(nc, relay, created.id, ["echo", "adopted"]) == ("adopted\n", 0)
    finally:
        await api.close()


@pytest.mark.req("NOD-6", "NOD-7", "NOD-8")
async def test_an_adxlet_frozen_past_its_session_comes_back_and_finishes_what_it_admitted(process_cluster) -> None:
    """Found by the fault soak (seed 3): the adxlet SIGSTOPped longer than its session TTL while a start was in
    flight; the start's commit was refused with 'session expired', the Environment stayed pending for good and
    the node never recovered its session."""
    cluster: ProcessCluster = process_cluster(coordinator_settings={"session_ttl_seconds": 3.0})
    api = api_of(cluster)
    node = cluster.nodes["n1"]
    try:
        await node_registered(api)
        in_flight = await api.create()
        node.adxlet.freeze()
        try:
            await asyncio.sleep(5)  # past the session's TTL
        finally:
            node.adxlet.thaw()
        await api.wait_state(in_flight.id, S.RUNNING, within=60)

        async def creates() -> bool:
            try:
                fresh = await api.create()
            except AdxError:
                return False
            await api.wait_state(fresh.id, S.RUNNING, within=30)
            return True

        await wait_for(creates, 60, "a create placed and running after the freeze", interval=0.5)
    finally:
        await api.close()


@pytest.mark.req("NOD-1", "CRD-7", "RST-7")
async def test_a_start_cut_short_before_it_reached_the_runtime_goes_on_after_an_adxlet_restart(node_cluster) -> None:
    """Found by the fault soak (seed 3): the adxlet died between committing Starting and recording the planned
    execution (recorded before every runtime call, so nothing was created). The successor left the Environment
    Starting for good. Now its start goes on under the same execution ID: no start failed (RST-7 does not
    apply), and the user's create is not failed by the crash."""
    from adx.node._agent import NodeAgent

    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    real_save = agent.executions.save
    stuck = asyncio.Event()

    def dies_here(execution):
        stuck.set()
        raise asyncio.CancelledError  # the process is gone at this point: nothing is written

    agent.executions.save = dies_here  # type: ignore[method-assign]
    try:
        created = await api.create()
        await asyncio.wait_for(stuck.wait(), 10)
        starting = await api.get(created.id)
        assert starting.state is S.STARTING and starting.execution_id
        agent.executions.save = real_save  # type: ignore[method-assign]
        await agent.stop()
        assert not list((agent.config.state_dir / "executions").glob("*.json"))
        successor = NodeAgent(agent.config)
        await successor.start()
        nc.nodes["n1"] = successor
        running = await api.wait_state(created.id, S.RUNNING, within=30)
        assert (running.execution_id, running.restart_attempts) == (starting.execution_id, 0)
        relay = await api.route(created.id)
        assert await run_via_relay(nc, relay, created.id, ["echo", "started"]) == ("started\n", 0)
    finally:
        await api.close()


@pytest.mark.req("NOD-12", "NOD-14", "RST-5")
async def test_ownership_revocation_cleans_the_old_execution_behind_admitted_operations_and_refuses_late_ones(
    node_cluster,
) -> None:
    """Seed 001: a newer generation of an Environment arrives while this node's Controller still holds the old
    one's execution. The old Controller cleans that execution after what it admitted before, and refuses every
    later operation (a late restart or resume can never bring the old execution back); the new Controller acts
    only after that cleanup."""
    from adx.errors import ConflictError

    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        running = await api.wait_state((await api.create()).id, S.RUNNING)
        old = agent.controllers[running.id]
        admitted_before = old.submit(Step.NOOP)
        newer = running.model_copy(
            update={
                "generation": running.generation + 1,
                "revision": running.revision + 1,
                "state": S.PAUSED,
                "execution_id": None,
            }
        )
        new = agent._take_over(old, newer)
        late = old.submit(Step.RESTART)
        await asyncio.wait_for(admitted_before, 10)
        with pytest.raises(ConflictError, match="revoked"):
            await asyncio.wait_for(late, 30)
        assert old.revoked and old.execution is None
        assert running.execution_id not in {s.sandbox_id for s in await agent.driver.client.list()}
        assert agent.controllers[running.id] is new and new.record.generation == running.generation + 1
        await asyncio.wait_for(new.drained(), 10)
    finally:
        await api.close()
