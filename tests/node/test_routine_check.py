"""The node's periodic routine check against the Coordinator's catalog (NOD-3, NOD-5, NOD-9, NOD-11, NOD-16), on
a real Coordinator + Redis, adxlet, sandboxd and execd. A catalog that is stale or slow is produced by holding
or replaying the real Coordinator's answer (fault injection on the backend), never by a fake Coordinator."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from process_cluster import wait_for
from test_node_agent import Api, run_via_relay

from adx.errors import UnavailableError
from adx.model import EnvironmentRecord, EnvironmentState
from adx.proto import coordinator_pb2 as pb

S = EnvironmentState

#: Driver calls that act on, or re-check, an execution (stats sampling runs on its own timer: MET-2).
ACTING_CALLS = ("start", "restore", "checkpoint", "thaw", "stop", "observe", "inventory", "delete_checkpoint")


def count_calls(target: Any, names: tuple[str, ...], counts: Counter[str], prefix: str) -> Callable[[], None]:
    """Count calls of ``target``'s methods ``names`` (they still run for real); returns the undo."""
    originals = {name: getattr(target, name) for name in names}

    def wrap(name: str, real: Any) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            counts[f"{prefix}.{name}"] += 1
            return await real(*args, **kwargs)

        return counted

    for name, real in originals.items():
        setattr(target, name, wrap(name, real))

    def undo() -> None:
        for name, real in originals.items():
            setattr(target, name, real)

    return undo


async def pause(api: Api, env_id: str) -> EnvironmentRecord:
    reply = await api.call(
        "pause", api.stub.PauseEnvironment(pb.EnvironmentRequest(tenant="acme", environment_id=env_id))
    )
    return EnvironmentRecord.model_validate_json(reply.environment_json)


@pytest.mark.req("NOD-16", "NOD-3")
async def test_healthy_consistent_instances_are_only_compared(node_cluster) -> None:
    """Rounds of the routine check over a healthy Running Environment whose catalog record matches commit
    nothing, probe nothing (no readiness re-check, no runtime call), re-bind no route and reset no idle window."""
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        created = await api.create(lifecycle={"idleTimeoutSeconds": 600, "idleAction": "delete"})
        running = await api.wait_state(created.id, S.RUNNING)
        relay = await api.route(created.id)
        assert await run_via_relay(nc, relay, created.id, ["true"]) == ("", 0)
        controller = agent.controllers[created.id]
        assert controller.execution is not None
        sandbox_id = str(controller.execution.native["sandbox_id"])
        await asyncio.sleep(1.0)  # the command's activity settles; the quiet window starts
        idle_before = agent.idle.idle_for(created.id, sandbox_id)
        before = time.monotonic()
        counts: Counter[str] = Counter()
        undo = [
            count_calls(agent.driver, ACTING_CALLS, counts, "driver"),
            count_calls(agent.readiness, ("wait_ready",), counts, "readiness"),
            count_calls(agent.sink, ("commit", "commit_wire"), counts, "sink"),
            count_calls(agent.relay, ("forget",), counts, "relay"),
        ]
        try:
            for _ in range(5):
                await agent._routine_check()  # plus the ones the report loop runs meanwhile
            await asyncio.sleep(4 * agent.config.report_interval_seconds)
        finally:
            for step in undo:
                step()
        assert counts == Counter(), f"a healthy instance was acted on: {dict(counts)}"
        assert controller is agent.controllers[created.id] and controller.state is S.RUNNING
        after = await api.get(created.id)
        assert (after.revision, after.execution_id, after.generation) == (
            running.revision,
            running.execution_id,
            running.generation,
        )
        # The idle window went on through the rounds: it was not restarted by them.
        idle_after = agent.idle.idle_for(created.id, sandbox_id)
        assert idle_after >= idle_before + (time.monotonic() - before) - 0.5, (idle_before, idle_after)
    finally:
        await api.close()


@pytest.mark.req("NOD-9", "NOD-5")
async def test_a_local_result_newer_than_the_catalog_is_not_overwritten_and_blocks_nothing(node_cluster) -> None:
    """The catalog read before a pause is published (so it still says Running at the older revision) reaches
    the routine check after the node paused the Environment: the node neither adopts the old record nor closes
    its admission, and a delete of another Environment goes through in that same round."""
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        a = await api.create()
        b = await api.create()
        await api.wait_state(a.id, S.RUNNING)
        await api.wait_state(b.id, S.RUNNING)
        stale = await agent.sink.catalog()  # the real Coordinator's answer, read now, handed over later
        stale_a = next(record for record in stale if record.id == a.id)
        assert stale_a.state is S.RUNNING
        await pause(api, a.id)
        paused = await api.wait_state(a.id, S.PAUSED)
        assert paused.revision > stale_a.revision
        await api.delete(b.id)  # the Coordinator marks it Deleting; the node deletes it in its queue

        real_catalog = agent.sink.catalog
        served_stale = 0

        async def stale_catalog(*, with_references: bool = False) -> list[EnvironmentRecord]:
            nonlocal served_stale
            served_stale += 1
            await real_catalog(with_references=with_references)  # references, retired checkpoints: current
            return stale

        agent.sink.catalog = stale_catalog  # type: ignore[method-assign]
        try:
            await agent._routine_check()
        finally:
            agent.sink.catalog = real_catalog  # type: ignore[method-assign]
        assert served_stale == 1
        controller = agent.controllers[a.id]
        assert controller.state is S.PAUSED and controller.record.revision == paused.revision
        assert agent.reporter.admission_open
        # The other Environment's delete was not held up by the stale record of A.
        await api.wait_state(b.id, S.DELETED, within=30)
        again = await api.get(a.id)
        assert (again.state, again.revision) == (S.PAUSED, paused.revision)
        # And the node still admits: a new Environment starts there.
        c = await api.create()
        await api.wait_state(c.id, S.RUNNING)
    finally:
        await api.close()


@pytest.mark.req("NOD-5")
async def test_a_controller_admitted_while_the_catalog_is_read_is_not_judged_by_it(node_cluster) -> None:
    """The routine check's catalog read is held while a new Environment is admitted on the node and a paused one
    is resumed there: that catalog predates both, and the round neither deletes, adopts nor restricts the new
    Controller, nor puts the resumed one back to its old Paused record (an old catalog never overwrites a newer
    execution)."""
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        dormant = await api.create()
        await api.wait_state(dormant.id, S.RUNNING)
        await pause(api, dormant.id)
        paused = await api.wait_state(dormant.id, S.PAUSED)
        real_catalog = agent.sink.catalog
        read = asyncio.Event()
        release = asyncio.Event()

        async def held_catalog(*, with_references: bool = False) -> list[EnvironmentRecord]:
            records = await real_catalog(with_references=with_references)
            read.set()
            await release.wait()
            return records

        agent.sink.catalog = held_catalog  # type: ignore[method-assign]
        try:
            round_task = asyncio.create_task(agent._routine_check())
            await asyncio.wait_for(read.wait(), 10)
            # The report loop's own rounds use the held catalog too: they wait with this one.
            created = await api.create()
            running = await api.wait_state(created.id, S.RUNNING)
            controller = agent.controllers[created.id]
            await api.call(
                "resume",
                api.stub.EnsureRunning(
                    pb.EnsureRunningRequest(tenant="acme", environment_id=dormant.id, timeout_seconds=30)
                ),
            )
            resumed = await api.wait_state(dormant.id, S.RUNNING)
            assert resumed.revision > paused.revision and resumed.execution_id
            release.set()
            await asyncio.wait_for(round_task, 10)
        finally:
            release.set()
            agent.sink.catalog = real_catalog  # type: ignore[method-assign]
        await asyncio.sleep(2 * agent.config.report_interval_seconds)
        assert agent.controllers.get(created.id) is controller
        assert controller.state is S.RUNNING and not controller.restricted
        after = await api.get(created.id)
        assert (after.state, after.execution_id, after.revision) == (S.RUNNING, running.execution_id, running.revision)
        woken = agent.controllers[dormant.id]
        assert woken.state is S.RUNNING and woken.execution is not None
        assert woken.execution.execution_id == resumed.execution_id
        again = await api.get(dormant.id)
        assert (again.state, again.execution_id, again.revision) == (S.RUNNING, resumed.execution_id, resumed.revision)
        relay = await api.route(dormant.id)
        assert await run_via_relay(nc, relay, dormant.id, ["echo", "awake"]) == ("awake\n", 0)
    finally:
        await api.close()


@pytest.mark.req("NOD-11")
async def test_a_failed_cleanup_restricts_only_that_environment_and_retries(node_cluster) -> None:
    """The runtime refuses to stop one Environment's execution during its delete: that Environment alone waits
    (its delete is retried and lands once the runtime answers again); the node keeps admitting, and another
    Environment on it keeps serving and pauses meanwhile."""
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        a = await api.create()
        b = await api.create()
        running_a = await api.wait_state(a.id, S.RUNNING)
        await api.wait_state(b.id, S.RUNNING)
        real_stop = agent.driver.stop
        refused = 0
        healed = asyncio.Event()

        async def refusing_stop(execution: Any) -> None:
            nonlocal refused
            if execution.execution_id == running_a.execution_id and not healed.is_set():
                refused += 1
                raise UnavailableError("sandboxd: delete failed (injected)")
            await real_stop(execution)

        agent.driver.stop = refusing_stop  # type: ignore[method-assign]
        try:
            await api.delete(a.id)
            await wait_for(lambda: refused >= 2, 20, "the refused cleanup retried")
            assert (await api.get(a.id)).state is S.DELETING
            assert agent.reporter.admission_open
            relay = await api.route(b.id)
            assert await run_via_relay(nc, relay, b.id, ["echo", "b"]) == ("b\n", 0)
            await pause(api, b.id)
            await api.wait_state(b.id, S.PAUSED)
            c = await api.create()
            await api.wait_state(c.id, S.RUNNING)
            healed.set()
            await api.wait_state(a.id, S.DELETED, within=40)
        finally:
            agent.driver.stop = real_stop  # type: ignore[method-assign]
        assert agent.executions.get(running_a.execution_id) is None
    finally:
        await api.close()


@pytest.mark.req("NOD-20")
async def test_a_missing_local_controller_recovers_only_that_instance(node_cluster) -> None:
    """One Environment's Controller disappears from the node (its execution still runs): the next routine check
    recovers that instance alone, adopting the same execution (no restart, no second execution); the other
    Environment's Controller is not touched and the node keeps admitting."""
    nc = await node_cluster()
    api = Api(nc)
    agent = nc.nodes["n1"]
    try:
        lost = await api.create()
        kept = await api.create()
        running = await api.wait_state(lost.id, S.RUNNING)
        await api.wait_state(kept.id, S.RUNNING)
        kept_controller = agent.controllers[kept.id]
        gone = agent.controllers.pop(lost.id)
        await gone.close()
        recovered = await wait_for(lambda: agent.controllers.get(lost.id), 15, "the missing Controller recovered")
        await wait_for(lambda: recovered.state is S.RUNNING and recovered.serving, 15, "it serves again")
        assert recovered.execution is not None and recovered.execution.execution_id == running.execution_id
        after = await api.get(lost.id)
        assert (after.state, after.execution_id, after.restart_attempts) == (S.RUNNING, running.execution_id, 0)
        assert agent.controllers[kept.id] is kept_controller and agent.reporter.admission_open
        relay = await api.route(lost.id)
        assert await run_via_relay(nc, relay, lost.id, ["echo", "back"]) == ("back\n", 0)
        sandboxes = [item for item in await agent.driver.inventory() if item.env_id == lost.id]
        assert [item.execution_id for item in sandboxes] == [running.execution_id]  # never two
    finally:
        await api.close()
