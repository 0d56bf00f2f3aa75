"""Journaled results survive a node session that changes during their replay (JRN-5, NOD-6, NOD-17), on real
parts: a real Coordinator on a real Redis, the node's real Coordinator client and a real SQLite journal.

The bench at 10,000 Environments over 50 adxlets (docs/performance.md) left 191 Environments `pending` or
`starting` in Redis while their nodes had run them and journaled Running: with Redis refusing connections the
nodes' heartbeats failed past the session TTL, so replays queued earlier sent their commit under the expired
session while the report loop registered a new one. The commit's session rejection was read as a revision
conflict; the authority's record (still the entry's base) then read as "conflict" and every entry was dropped,
never to be published.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_controller import placed_environment, registered_reporter

from adx.coordinator import CoordinatorStore
from adx.errors import SessionRejectedError
from adx.model import EnvironmentRecord, EnvironmentState, new_id
from adx.node._coordinator_client import CoordinatorSink
from adx.node._journal import DegradationJournal, NewResult, spec_digest
from adx.node._replay import ReplayEnd, replay

S = EnvironmentState


def _result(record: EnvironmentRecord, base_revision: int, base: S, state: S, execution_id: str) -> NewResult:
    return NewResult(
        env_id=record.id,
        generation=record.generation,
        base_revision=base_revision,
        base_state=base,
        base_execution_id=None if base is S.PENDING else execution_id,
        state=state,
        execution_id=execution_id,
        changes={"state": state.value, "executionId": execution_id},
        release_reservation=False,
        spec_digest=spec_digest(record.spec),
    )


@pytest.mark.req("JRN-5", "NOD-17", "NOD-6")
async def test_a_session_rejected_during_replay_keeps_the_journaled_results_and_they_publish_later(
    coordinator_cluster, tmp_path: Path
) -> None:
    """A pending Environment's start and Running, journaled; the node registers a new session while a replay's
    commit still carries the old one. That replay keeps every entry (nothing is a verdict on them); the next
    replay, under the new session, publishes both in order: Redis shows Running at revision 3."""
    cluster, _ = await coordinator_cluster()
    channel, stub = cluster.stub("n1")
    store = CoordinatorStore.from_url(cluster.config.redis_url)
    journal = DegradationJournal(tmp_path / "journal.db")
    try:
        reporter = await registered_reporter(stub)
        old_session = reporter.state.session
        assert reporter.state.registered and old_session
        created = await placed_environment(store, cluster)
        execution_id = new_id("exe")
        await journal.append(_result(created, 1, S.PENDING, S.STARTING, execution_id))
        await journal.append(_result(created, 2, S.STARTING, S.RUNNING, execution_id))

        # The report loop registers a new session (the old one was rejected) while a replay is in flight: its
        # commit was sent under the old session, its read of the authority goes out under the new one.
        await reporter.register()
        assert reporter.state.session != old_session
        in_flight = CoordinatorSink(stub, "n1", lambda: old_session, rpc_timeout=5)
        current = CoordinatorSink(stub, "n1", lambda: reporter.state.session, rpc_timeout=5)
        with pytest.raises(SessionRejectedError):
            await replay(journal, in_flight, "n1", await journal.pending(created.id), current.fetch)
        assert [(e.state, e.revision) for e in await journal.pending(created.id)] == [(S.STARTING, 2), (S.RUNNING, 3)]
        stored = await store.get_environment(created.id)
        assert (stored.state, stored.revision) == (S.PENDING, 1)

        # The next replay request (the Coordinator answers the new session) publishes both, in order.
        outcome = await replay(journal, current, "n1", await journal.pending(created.id), current.fetch)
        assert (outcome.end, outcome.committed, outcome.dropped, outcome.remaining) == (ReplayEnd.DONE, 2, 0, 0)
        stored = await store.get_environment(created.id)
        assert (stored.state, stored.revision, stored.execution_id) == (S.RUNNING, 3, execution_id)
        assert not journal.exists
    finally:
        journal.close()
        await store.close()
        await channel.close()
