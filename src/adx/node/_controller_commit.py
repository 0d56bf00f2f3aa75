"""Committing a Controller's results to the Coordinator: compare-and-set on revision and generation, retried
while the Coordinator is away (NOD-6, NOD-7), journaled behind earlier journaled results (JRN-2, JRN-3),
replayed in order (NOD-17), and the authoritative record a restricted Controller waits for (NOD-10).
Every transition is logged here with the Environment ID, execution ID and generation.
"""

from __future__ import annotations

import time

from adx._backoff import Backoff
from adx.errors import AdxError, ConflictError, SessionRejectedError, UnavailableError, UncertainOutcomeError
from adx.model import EnvironmentRecord, EnvironmentState, check_transition
from adx.model._records import RecordChanges
from adx.node._controller_core import ControllerCore, DroppedResults, S, log
from adx.node._coordinator_client import wire_changes
from adx.node._journal import NewResult, spec_digest
from adx.node._operations import SetNetwork, Step
from adx.node._replay import ReplayEnd, ReplayOutcome, dropped_checkpoints, led_to, replay


class CommitSteps(ControllerCore):
    """Results committed (or journaled) in order, and the authority's record adopted."""

    async def _transition(
        self,
        target: EnvironmentState,
        changes: RecordChanges | None = None,
        *,
        release: bool = False,
        retry: bool = True,
    ) -> EnvironmentRecord:
        """Check, commit (with retries while the Coordinator is unavailable, unless ``retry`` is False: the
        caller keeps its own deadline) and log one transition."""
        current = self.record.state
        if current != target:
            check_transition(current, target, env_id=self.env_id)
        update: RecordChanges = {"state": target, **(changes or {})}
        retry_delay = Backoff(self.timings.retry_min_seconds, self.timings.retry_max_seconds)
        adopted = False
        journaled = False
        while True:
            if self.unpublished:
                # JRN-3: behind a journaled result, every later one is journaled too, in order.
                committed = await self._journal_result(update, release)
                if committed is not None:
                    journaled = True
                    break
                # The journal refuses writes: publish what it holds if the Coordinator is back, then commit.
                dropped_before = self.dropped
                try:
                    await self._publish_journaled()
                except SessionRejectedError as exc:
                    # NOD-6: the node registers again; the entries stay journaled and this result pending.
                    log.warning("journal replay waits for the node's new session: %s", exc, extra=self._context())
                if self.dropped is not dropped_before:
                    # This result followed results the Coordinator refused: it is as stale as they are, and the
                    # Controller now holds the authority's record (converged to in its queue).
                    raise ConflictError(
                        f"environment {self.env_id}: the {target.value} result followed journaled results the "
                        f"Coordinator refused (it holds {self.record.state.value} at revision {self.record.revision})"
                    )
                if self.unpublished:
                    await retry_delay.sleep()
                continue
            try:
                committed = await self.sink.commit(self.record, update, release_reservation=release)
                break
            except SessionRejectedError as exc:
                # NOD-6: not a verdict on this result: the node registers again and the commit is retried.
                self.commit_retrying = True
                log.warning(
                    "commit of %s waits for the node's new session: %s", target.value, exc, extra=self._context()
                )
                await retry_delay.sleep()
                continue
            except ConflictError:
                # The Coordinator may have changed fields this node does not own (a lifetime deadline, a
                # resume-retry mark): if ownership, state and execution are unchanged, go on from its version
                # (NOD-10: compare published state and revision, never flag such an update as a conflict).
                latest = None if adopted else await self._latest_or_none()
                if latest is None or not self._same_ownership(latest):
                    raise
                self.record, adopted = latest, True
            except (UnavailableError, UncertainOutcomeError) as exc:
                if not retry:
                    raise
                # JRN-2: only an unavailable Coordinator degrades, and only a stored entry counts as journaled.
                if self.journal is not None and self.journal.configured:
                    committed = await self._journal_result(update, release)
                    if committed is not None:
                        journaled = True
                        break
                # NOD-7: the result stays pending here and is retried on this Controller's own deadline.
                self.commit_retrying = True
                log.warning("commit of %s pending: %s", target.value, exc, extra=self._context())
                await retry_delay.sleep()
                latest = await self._latest_or_none()
                if latest is not None and latest.revision > self.record.revision:
                    # An uncertain commit may have landed: continue from what the authority holds.
                    self.record = latest
                    if latest.state == target:
                        committed = latest
                        break
        self.commit_retrying = False
        previous = self.record
        self.record = committed
        if committed.state is S.RUNNING and committed.network_revision > committed.network_applied_revision:
            # NOD-10: the commit met a policy stored meanwhile (adopted above): apply it in place now, after this.
            self.submit(SetNetwork(committed))
        if self.on_transition is not None:
            self.on_transition(self.env_id)
        log.info(
            "environment %s: %s -> %s%s",
            self.env_id,
            previous.state.value,
            committed.state.value,
            " (journaled: publication pending)" if journaled else "",
            extra={**self._context(), "revision": committed.revision},
        )
        return committed

    async def _journal_result(self, update: RecordChanges, release: bool) -> EnvironmentRecord | None:
        """Store this result in the degradation journal and go on from it as the local record (JRN-2, JRN-3).
        None when the journal could not store it (the caller keeps it pending in memory: never "journaled")."""
        if self.journal is None or not self.journal.configured:
            return None
        base = self.record
        local = EnvironmentRecord.model_validate(
            {**base.model_dump(), **update, "revision": base.revision + 1, "updated_at": time.time()}
        )
        try:
            await self.journal.append(
                NewResult(
                    env_id=self.env_id,
                    generation=base.generation,
                    base_revision=base.revision,
                    base_state=base.state,
                    base_execution_id=base.execution_id,
                    state=local.state,
                    execution_id=local.execution_id,
                    changes=wire_changes(base, update),
                    release_reservation=release,
                    spec_digest=spec_digest(base.spec),
                )
            )
        except UnavailableError as exc:
            log.error("result not journaled, kept pending in memory: %s", exc, extra=self._context())
            return None
        self.unpublished += 1
        return local

    async def _replay(self) -> EnvironmentRecord:
        """NOD-17/JRN-5: publish this Environment's journaled results, in order, from its own queue."""
        self._replay_queued = False
        return await self._publish_journaled()

    async def _publish_journaled(self) -> EnvironmentRecord:
        if self.journal is None or not self.unpublished:
            return self.record
        entries = await self.journal.pending(self.env_id)
        outcome = await replay(self.journal, self.sink, self.record.node or "", entries, self.sink.fetch)
        self.unpublished = outcome.remaining
        if outcome.end is ReplayEnd.DROPPED:
            self._adopt_after_drop(outcome)
        elif (
            outcome.end is ReplayEnd.DONE
            and outcome.record is not None
            and outcome.record.revision >= self.record.revision
        ):
            self.record = outcome.record
        log.info(
            "journal replay %s: %d committed, %d dropped, %d remaining",
            outcome.end.value,
            outcome.committed,
            outcome.dropped,
            outcome.remaining,
            extra=self._context(),
        )
        return self.record

    def adopt_startup_drop(self, outcome: ReplayOutcome, catalog: EnvironmentRecord) -> None:
        """JRN-6: the startup barrier's replay dropped this Environment's results before its Controller existed.
        They are judged as a drop at runtime is (the same adoption and Step.CONVERGE), from the local record they
        had led to; the catalog read after the replay stays the record when it is newer than the authority's."""
        self._adopt_after_drop(outcome, led_to(catalog, outcome.dropped_entries))
        if catalog.revision > self.record.revision:
            self.record = catalog

    def _adopt_after_drop(self, outcome: ReplayOutcome, local: EnvironmentRecord | None = None) -> None:
        """NOD-10/NOD-11: the Coordinator refused the journaled results for good. The local record they led to
        (past the Coordinator's revision) is no authority: the Coordinator's record of the same node and
        generation is adopted at once, so every later operation (a delete queued meanwhile first) compares and
        commits against it; Step.CONVERGE then makes the runtime match it. Any other answer (ownership gone or
        moved on) restricts this Controller until the routine check decides (take-over, or forgetting it)."""
        authority, local = outcome.authority, local or self.record
        adopted = authority is not None and authority.node == local.node and authority.generation == local.generation
        checkpoints = dropped_checkpoints(outcome)
        earlier = self.dropped
        if earlier is not None:  # a second drop before the first one converged: both leave their artifacts
            local, checkpoints = earlier.local, earlier.checkpoints + checkpoints
        self.dropped = DroppedResults(local, authority, adopted, checkpoints)
        if adopted:
            assert authority is not None
            self.record = authority
            self.restricted = False
            log.warning(
                "journaled results refused: the Coordinator's record (%s at revision %d) replaces the local one "
                "(%s at revision %d)",
                authority.state.value,
                authority.revision,
                local.state.value,
                local.revision,
                extra=self._context(),
            )
        else:
            self.restricted = True
        self.submit(Step.CONVERGE)

    async def _adopt(self, incoming: EnvironmentRecord) -> EnvironmentRecord:
        """NOD-10: the authoritative check a restricted Controller waits for: its record is adopted when it
        describes what this node really runs (same generation and execution)."""
        local_execution = self.execution.execution_id if self.execution is not None else None
        if (
            self.restricted
            and incoming.generation == self.record.generation
            and incoming.execution_id == local_execution
        ):
            self.record = incoming
            self.restricted = False
            log.info("authoritative record adopted", extra=self._context())
        elif self.restricted:
            log.warning(
                "still restricted: the Coordinator holds %s/%s, this node runs %s",
                incoming.state.value,
                incoming.execution_id,
                local_execution,
                extra=self._context(),
            )
        return self.record

    def _same_ownership(self, other: EnvironmentRecord) -> bool:
        mine = self.record
        return (other.node, other.generation, other.state, other.execution_id) == (
            mine.node,
            mine.generation,
            mine.state,
            mine.execution_id,
        ) and other.revision > mine.revision

    async def _latest_or_none(self) -> EnvironmentRecord | None:
        try:
            return await self.sink.fetch(self.env_id)
        except AdxError:
            return None
