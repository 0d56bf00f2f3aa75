"""Lifecycle coordination: commits each driver handoff as ONE transaction, with exact lost-ACK replay.

Success, failure and cancellation first recover trusted evidence (:class:`GraphLifecycleEvidenceProvider`),
validate schemas offline and build the final result; only then one transaction finalises the run. An evidence
error releases the exact fence and never partially finalises anything (AGT-4).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from adx.agents._canonical import JsonObject, digest
from adx.agents._errors import EvidenceError, SchemaValidationError, StaleFenceError
from adx.agents._graph import Budget, ExecutableGraphRegistry
from adx.agents._handoffs import (
    CancellationHandoff,
    FailureHandoff,
    Handoff,
    ReleaseHandoff,
    ReleaseKind,
    SuccessHandoff,
    WaitHandoff,
)
from adx.agents._options import require_at_least, require_positive
from adx.agents._rows import Claim, RunKey, WaitCommit
from adx.agents._schemas import (
    AGENT_CANCELLATION_EVENT_SCHEMA_ID,
    GRAPH_LIFECYCLE_EVENT_SCHEMA_ID,
    WORKER_AUDIT_SCHEMAS,
)
from adx.agents._status import AttemptStatus, RunStatus
from adx.agents._store import AgentStore
from adx.errors import AdxError, InvalidInputError, NotFoundError, UncertainOutcomeError

__all__ = [
    "DurableGraphLifecycle",
    "DurableGraphLifecycleOptions",
    "EvidenceRequest",
    "ExecutedOutcome",
    "GraphLifecycleEvidenceProvider",
    "LifecycleEvidence",
    "LifecycleResult",
]

log = logging.getLogger("adx.agents.lifecycle")


class ExecutedOutcome(StrEnum):
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RECOVERY_RELEASED = "recovery_released"
    DEFERRED = "deferred"
    YIELDED = "yielded"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class DurableGraphLifecycleOptions:
    evidence_timeout_seconds: float = 10.0
    evidence_retry_seconds: float = 5.0
    commit_attempts: int = 3

    def __post_init__(self) -> None:
        require_positive(self, "evidence_timeout_seconds")
        if not self.evidence_retry_seconds >= 0:
            raise InvalidInputError("evidence_retry_seconds", "must not be negative")
        require_at_least(self, 1, "commit_attempts")


@dataclass(frozen=True, slots=True)
class EvidenceRequest:
    key: RunKey
    fence: int
    checkpoint_seq: int
    kind: str  # "success" | "failure" | "cancellation"


@dataclass(frozen=True, slots=True)
class LifecycleEvidence:
    """Persisted facts the terminal barrier does not own: admission, artifact, cumulative usage."""

    key: RunKey
    checkpoint_seq: int
    descriptor: JsonObject
    request: JsonObject
    budget: JsonObject
    artifact: Any
    terminal_ready: bool
    usage: dict[str, int]


@dataclass(frozen=True, slots=True)
class LifecycleResult:
    outcome: ExecutedOutcome
    event_id: uuid.UUID
    revision: int | None = None
    result: JsonObject | None = None  # the committed result document
    usage: dict[str, int] | None = None
    wait: WaitCommit | None = None
    replayed: bool = False
    reason: str | None = None


class GraphLifecycleEvidenceProvider:
    """Provider-native evidence: bounded, deterministic, read-only recovery from the runtime's own tables.

    It never repeats model or tool work, never guesses a request and never fills missing usage with zero
    (AGT-3). Applications subclass it to add their own checks (e.g. artifact provenance) by overriding
    :meth:`recover` and calling ``super()``.
    """

    async def recover(self, store: AgentStore, request: EvidenceRequest) -> LifecycleEvidence:
        facts = await store.read_evidence(request.key, request.checkpoint_seq)
        checkpoint = facts.checkpoint
        if checkpoint is None:
            raise EvidenceError(f"run {request.key.run_id}: checkpoint {request.checkpoint_seq} is not persisted")
        if facts.missing_usage:
            raise EvidenceError(
                f"run {request.key.run_id}: {facts.missing_usage} model call(s) have no recorded usage;"
                " refusing to report zero"
            )
        return LifecycleEvidence(
            key=request.key,
            checkpoint_seq=checkpoint.seq,
            descriptor=facts.descriptor,
            request=facts.request,
            budget=facts.budget,
            artifact=checkpoint.artifact,
            terminal_ready=checkpoint.next_node is None,
            usage=facts.usage,
        )


def _event_base(kind: str, handoff: Handoff, checkpoint_seq: int) -> JsonObject:
    return {
        "kind": kind,
        "event_id": str(handoff.event_id),
        "run_id": str(handoff.claim.key.run_id),
        "fence": handoff.claim.fence,
        "checkpoint_seq": checkpoint_seq,
    }


class DurableGraphLifecycle:
    """Commits handoffs. Construction fails closed unless all three standard audit schemas are frozen in."""

    def __init__(
        self,
        store: AgentStore,
        executables: ExecutableGraphRegistry,
        evidence: GraphLifecycleEvidenceProvider,
        options: DurableGraphLifecycleOptions,
    ) -> None:
        schemas = executables.schemas
        for schema_id in WORKER_AUDIT_SCHEMAS:
            if schema_id not in schemas:
                raise InvalidInputError(
                    "schemas", f"lifecycle start-up refused: the standard schema {schema_id} is not registered"
                )
        if not getattr(evidence, "recover", None):
            raise InvalidInputError("evidence_provider", "must provide recover(store, request)")
        self.store = store
        self.executables = executables
        self.evidence = evidence
        self.options = options
        self._lifecycle_schema = schemas.ref(GRAPH_LIFECYCLE_EVENT_SCHEMA_ID)
        self._cancel_schema = schemas.ref(AGENT_CANCELLATION_EVENT_SCHEMA_ID)

    async def commit(self, handoff: Handoff) -> LifecycleResult:
        if isinstance(handoff, WaitHandoff):
            return await self.commit_wait(handoff)
        if isinstance(handoff, SuccessHandoff):
            return await self.commit_success(handoff)
        if isinstance(handoff, FailureHandoff):
            return await self.commit_failure(handoff)
        if isinstance(handoff, CancellationHandoff):
            return await self.commit_cancellation(handoff)
        return await self.commit_release(handoff)

    # --- wait (AGT-5, AGT-10) ----------------------------------------------------------------------------

    async def commit_wait(self, h: WaitHandoff) -> LifecycleResult:
        event = {
            **_event_base("waiting", h, h.step + 1),
            "attempt_id": str(h.attempt_id),
            "waits": [
                {
                    k: v
                    for k, v in (("wait_id", w["wait_id"]), ("kind", w["kind"]), ("timer_ms", w["timer_ms"]))
                    if v is not None
                }
                for w in h.waits
            ],
        }
        self.executables.schemas.validate(GRAPH_LIFECYCLE_EVENT_SCHEMA_ID, event)

        async def commit() -> LifecycleResult:
            wait = await self.store.commit_wait(h, event=event, schema=self._lifecycle_schema)
            return LifecycleResult(ExecutedOutcome.WAITING, h.event_id, wait["revision"], wait=wait)

        return await self._commit_or_replay(commit, lambda: self.replay_wait(h))

    async def _commit_or_replay(
        self,
        commit: Callable[[], Awaitable[LifecycleResult]],
        replay: Callable[[], Awaitable[LifecycleResult | None]],
    ) -> LifecycleResult:
        """Commit an edge, up to ``commit_attempts`` times. After an uncertain outcome or a stale fence the
        committed facts decide: a lost-ACK replay of this very edge answers; otherwise a stale fence, or the last
        uncertain attempt, raises (AGT-9, AGT-10)."""
        for attempt in range(self.options.commit_attempts):
            try:
                return await commit()
            except (UncertainOutcomeError, StaleFenceError) as exc:
                replayed = await replay()
                if replayed is not None:
                    return replayed
                if isinstance(exc, StaleFenceError) or attempt + 1 == self.options.commit_attempts:
                    raise
        raise AssertionError("unreachable")

    async def replay_wait(self, h: WaitHandoff) -> LifecycleResult | None:
        """Event-first replay (AGT-10): verify the original event, projection, checkpoint, result consumption and
        immutable registrations; return the original commit without touching the run's later state."""
        try:
            commit = await self.store.read_wait_commit(h.claim.key, h.event_id)
        except NotFoundError:
            return None
        expected = sorted((w["wait_id"], w["kind"], w["timer_ms"]) for w in h.waits)
        registered = sorted((w["wait_id"], w["kind"], w["timer_ms"]) for w in commit["waits"])
        problems = []
        if commit["kind"] != "waiting" or commit["fence"] != h.claim.fence or commit["checkpoint_seq"] != h.step + 1:
            problems.append("event projection differs")
        if (
            commit["payload"].get("attempt_id") != str(h.attempt_id)
            or commit["attempt_status"] != AttemptStatus.COMPLETED
        ):
            problems.append("node result was not consumed by this event")
        if registered != expected:
            problems.append("wait registrations differ")
        if not commit["checkpoint_present"] and commit["checkpoint_seq"] > 0:
            # Retention may prune old checkpoints; only a missing *current* one would be an inconsistency.
            run = await self.store.read_run(h.claim.key)
            if run.checkpoint_seq - self.store.checkpoint_retention < commit["checkpoint_seq"]:
                problems.append("successor checkpoint missing")
        if problems:
            raise StaleFenceError(f"wait replay of event {h.event_id} refused: {', '.join(problems)}")
        return LifecycleResult(ExecutedOutcome.WAITING, h.event_id, commit["revision"], wait=commit, replayed=True)

    # --- terminal edges (AGT-6..9) -----------------------------------------------------------------------

    async def replay_terminal(
        self, claim: Claim, event_id: uuid.UUID, status: RunStatus, revision: int
    ) -> LifecycleResult | None:
        """Lost-ACK replay (AGT-9): only the same event, committed at exactly ``revision + 1`` (the driver's last
        revision plus this edge) and unchanged since, with the expected terminal status and a cleared lease;
        anything else is stale and fails closed. Committed facts are returned; evidence is not read again."""
        facts = await self.store.read_terminal(claim.key, event_id)
        if facts is None:
            return None
        ok = (
            facts.terminal_event_id == event_id
            and facts.event_revision == revision + 1
            and facts.event_fence == claim.fence
            and facts.status == status
            and facts.result_status == status
            and facts.lease_owner is None
            and facts.revision == facts.event_revision
        )
        if not ok:
            raise StaleFenceError(
                f"run {claim.key.run_id}: terminal replay of event {event_id} refused (run is {facts.status},"
                f" revision {facts.revision}, event revision {facts.event_revision})"
            )
        return LifecycleResult(
            ExecutedOutcome(status),
            event_id,
            int(facts.revision),
            result=facts.result,
            usage=facts.usage,
            replayed=True,
        )

    async def _recover(self, h: Handoff, kind: str) -> LifecycleEvidence:
        request = EvidenceRequest(h.claim.key, h.claim.fence, h.step, kind)
        try:
            return await asyncio.wait_for(
                self.evidence.recover(self.store, request), timeout=self.options.evidence_timeout_seconds
            )
        except EvidenceError:
            raise
        except TimeoutError:
            raise EvidenceError(f"evidence recovery exceeded {self.options.evidence_timeout_seconds}s") from None
        except AdxError as exc:
            raise EvidenceError(f"evidence recovery failed: {exc}") from exc

    def _check_admission(self, claim: Claim, ev: LifecycleEvidence) -> None:
        graph = self.executables.get(claim.graph_name, claim.graph_version)
        if ev.key != claim.key or ev.checkpoint_seq < 0:
            raise EvidenceError("evidence provenance names another run")
        if digest(ev.descriptor) != digest(claim.descriptor) or ev.descriptor.get("graph_digest") != graph.digest:
            raise EvidenceError("evidence descriptor differs from the admitted descriptor")
        if digest(ev.request) != digest(claim.request):
            raise EvidenceError("evidence request differs from the admitted request")
        if digest(ev.budget) != digest(claim.budget):
            raise EvidenceError("evidence budget differs from the resolved budget")
        try:
            # Offline schema validation of the admitted input (schemas are frozen; no network).
            self.executables.schemas.validate(graph.input_schema, ev.request.get("input"))
        except SchemaValidationError as exc:
            raise EvidenceError(f"admitted input no longer validates: {exc}") from exc

    async def _release_on_evidence_error(self, h: Handoff, exc: Exception) -> LifecycleResult:
        log.warning(
            "lifecycle evidence error; releasing the exact fence",
            extra={"run_id": str(h.claim.key.run_id), "fence": h.claim.fence, "error": str(exc)},
        )
        attempt_id: uuid.UUID | None = getattr(h, "attempt_id", None)
        # A failed node stays failed (it counts toward quarantine); a never-dispatched next node is skipped.
        status = (
            None
            if attempt_id is None
            else (AttemptStatus.FAILED if isinstance(h, FailureHandoff) else AttemptStatus.SKIPPED)
        )
        release = ReleaseHandoff(
            h.claim,
            uuid.uuid4(),
            h.step,
            ReleaseKind.RECOVERY_RELEASED,
            f"evidence error: {exc}",
            self.options.evidence_retry_seconds,
            attempt_id,
            status,
        )
        result = await self.commit_release(release)
        return LifecycleResult(result.outcome, result.event_id, result.revision, reason=str(exc))

    async def _evidence(
        self,
        h: SuccessHandoff | FailureHandoff | CancellationHandoff,
        status: RunStatus,
        kind: str,
        check: Callable[[LifecycleEvidence], None] | None = None,
    ) -> LifecycleEvidence | LifecycleResult:
        """The steps before a terminal commit: a lost-ACK replay of this very edge answers at once; otherwise the
        handoff must still be current, and evidence is recovered and checked (``check``: the edge's own checks).
        An evidence error releases the exact fence instead (AGT-4; AGT-8: a cancellation without evidence
        stays requested, released and retried later)."""
        replay = await self.replay_terminal(h.claim, h.event_id, status, h.revision)
        if replay is not None:
            return replay
        await self.store.check_current(h.claim, h.step)
        try:
            ev = await self._recover(h, kind)
            self._check_admission(h.claim, ev)
            if check is not None:
                check(ev)
        except EvidenceError as exc:
            return await self._release_on_evidence_error(h, exc)
        return ev

    async def _finalise(
        self,
        h: SuccessHandoff | FailureHandoff | CancellationHandoff,
        ev: LifecycleEvidence,
        status: RunStatus,
        *,
        outcome: JsonObject,
        artifact: Any,
        attempt_id: uuid.UUID | None,
        error: str | None,
    ) -> LifecycleResult:
        """Build the result document (``outcome``: what the run produced or why it failed) and its journal event,
        validate the event offline, and commit both in one statement; a lost ACK or a concurrent change is
        decided by the committed facts, never by a second evidence read."""
        cancelled = status is RunStatus.CANCELLED
        result = {
            "run_id": str(h.claim.key.run_id),
            "status": status.value,
            **outcome,
            "usage": ev.usage,
            "descriptor_digest": digest(ev.descriptor),
            "request_digest": digest(ev.request),
            "budget": ev.budget,
            "event_id": str(h.event_id),
        }
        event_kind = "cancellation_confirmed" if cancelled else status.value
        event = _event_base(event_kind, h, h.step + 1)
        if error is not None:
            event["reason"] = error
        event["usage"] = ev.usage
        if not cancelled:  # the cancellation event's schema has no result digest
            event["result_digest"] = digest(result)
        schema = self._cancel_schema if cancelled else self._lifecycle_schema
        self.executables.schemas.validate(schema.schema_id, event)

        async def commit() -> LifecycleResult:
            revision = await self.store.commit_terminal(
                h.claim,
                status=status,
                step=h.step,
                artifact=artifact,
                result=result,
                usage=ev.usage,
                event_id=h.event_id,
                event_kind=event_kind,
                event=event,
                schema=schema,
                attempt_id=attempt_id,
                error=error,
            )
            return LifecycleResult(ExecutedOutcome(status), h.event_id, revision, result=result, usage=ev.usage)

        return await self._commit_or_replay(
            commit, lambda: self.replay_terminal(h.claim, h.event_id, status, h.revision)
        )

    async def commit_success(self, h: SuccessHandoff) -> LifecycleResult:
        ev = await self._evidence(h, RunStatus.SUCCEEDED, "success", lambda ev: self._check_success(h, ev))
        if isinstance(ev, LifecycleResult):
            return ev
        return await self._finalise(
            h,
            ev,
            RunStatus.SUCCEEDED,
            outcome={"artifact": ev.artifact},
            artifact=ev.artifact,
            attempt_id=None,
            error=None,
        )

    def _check_success(self, h: SuccessHandoff, ev: LifecycleEvidence) -> None:
        graph = self.executables.get(h.claim.graph_name, h.claim.graph_version)
        if ev.checkpoint_seq != h.step or not ev.terminal_ready:
            raise EvidenceError(f"checkpoint {h.step} is not the run's terminal-ready checkpoint")
        if digest(ev.artifact) != digest(h.artifact):
            raise EvidenceError("persisted artifact differs from the handoff's artifact")
        if ev.usage != h.usage:
            raise EvidenceError(f"rebuilt usage {ev.usage} differs from the driver's {h.usage}")
        try:
            self.executables.schemas.validate(graph.output_schema, ev.artifact)
        except SchemaValidationError as exc:
            raise EvidenceError(f"artifact does not match the output schema: {exc}") from exc
        budget = Budget(**ev.budget)
        if ev.usage["node_commits"] > budget.max_steps:
            raise EvidenceError("usage exceeds the resolved budget")

    async def commit_failure(self, h: FailureHandoff) -> LifecycleResult:
        if h.in_flight:
            # AGT-7: same-fence work in flight: hand ownership to higher-fence crash recovery.
            release = ReleaseHandoff(
                h.claim,
                h.event_id,
                h.step,
                ReleaseKind.RECOVERY_RELEASED,
                f"in-flight work at failure: {h.reason}",
                0.0,
                h.attempt_id,
                AttemptStatus.FAILED,
                h.reason,
            )
            return await self.commit_release(release)
        ev = await self._evidence(h, RunStatus.FAILED, "failure")
        if isinstance(ev, LifecycleResult):
            return ev
        return await self._finalise(
            h,
            ev,
            RunStatus.FAILED,
            outcome={"failure": {"reason": h.reason}},
            artifact=None,
            attempt_id=h.attempt_id,
            error=h.reason,
        )

    async def commit_cancellation(self, h: CancellationHandoff) -> LifecycleResult:
        ev = await self._evidence(h, RunStatus.CANCELLED, "cancellation")
        if isinstance(ev, LifecycleResult):
            return ev
        return await self._finalise(
            h, ev, RunStatus.CANCELLED, outcome={}, artifact=None, attempt_id=h.attempt_id, error=None
        )

    # --- release (Deferred, Yielded, RecoveryReleased) ---------------------------------------------------

    async def commit_release(self, h: ReleaseHandoff) -> LifecycleResult:
        event = {**_event_base("released", h, h.step), "outcome": h.kind.value, "reason": h.reason[:1024]}
        self.executables.schemas.validate(GRAPH_LIFECYCLE_EVENT_SCHEMA_ID, event)
        # A released run goes to the back of the queue: no head-of-line blocking.
        revision = await self.store.release(h, requeue=True, event=event, schema=self._lifecycle_schema)
        return LifecycleResult(ExecutedOutcome(h.kind.value), h.event_id, revision, reason=h.reason)
