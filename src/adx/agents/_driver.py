"""The graph driver: runs one claimed run node by node under a renewed lease, checkpointing after each, and
returns a handoff.

The driver never finalises a run. It returns an exact *handoff* (:mod:`adx.agents._handoffs`: wait, success,
failure, cancellation or release) carrying a lifecycle event identity assigned once here;
:mod:`adx.agents._lifecycle` commits it. What a node sees while it runs is :mod:`adx.agents._context`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adx._backoff import capped_exponential
from adx.agents._canonical import digest, json_clone
from adx.agents._children import join_json
from adx.agents._context import BudgetExceededError, NodeContext, ToolOutcomeUnknownError
from adx.agents._environments import EnvironmentAccess, EnvironmentBroker
from adx.agents._errors import StaleFenceError, error_text
from adx.agents._graph import (
    END,
    Budget,
    ExecutableGraph,
    ExecutableGraphRegistry,
    Fail,
    Interrupt,
    Join,
    Next,
    NodeOutcome,
    NodeWaits,
    Timer,
)
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
from adx.agents._rows import Claim, WaitRegistration
from adx.agents._schemas import GRAPH_DRIVER_EVENT_SCHEMA_ID
from adx.agents._status import AttemptStatus, CheckpointKind
from adx.agents._store import AgentStore
from adx.errors import AdxError, InvalidInputError

if TYPE_CHECKING:
    from adx.agents._liveness import WorkerLiveness

__all__ = ["DurableGraphDriver", "DurableGraphDriverOptions", "ShutdownSignal"]

log = logging.getLogger("adx.agents.driver")


class ShutdownSignal:
    """A monotonic, process-owned shutdown flag: once set it stays set."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    async def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``, or less when the flag is set meanwhile; returns whether it is set."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout=seconds)
        return self._event.is_set()


@dataclass(frozen=True, slots=True)
class DurableGraphDriverOptions:
    lease_seconds: float = 30.0
    node_timeout_seconds: float = 120.0
    max_node_attempts: int = 5
    retry_backoff_seconds: float = 1.0
    max_retry_backoff_seconds: float = 60.0
    max_nodes_per_claim: int = 64
    #: The ADX API that ``ctx.environment(...)`` creates Environments through; None: not available.
    environments: EnvironmentAccess | None = None

    def __post_init__(self) -> None:
        require_positive(
            self, "lease_seconds", "node_timeout_seconds", "retry_backoff_seconds", "max_retry_backoff_seconds"
        )
        require_at_least(self, 1, "max_node_attempts", "max_nodes_per_claim")


@dataclass
class _Lease:
    """Renews the lease in the background; ``lost`` is set when the fence moved on or the lease ran out."""

    store: AgentStore
    claim: Claim
    lease_s: float
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    expires: float = 0.0

    def extended(self) -> None:
        self.expires = time.monotonic() + self.lease_s

    async def run(self) -> None:
        self.extended()
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                ok = await asyncio.wait_for(
                    self.store.renew_lease(self.claim.key, self.claim.fence, self.claim.owner, self.lease_s),
                    timeout=self.lease_s / 3,
                )
            except (AdxError, TimeoutError) as exc:
                # Unknown renewal outcome: keep the node running only while our last known lease holds.
                log.warning("lease renewal failed", extra={"run_id": str(self.claim.key.run_id), "error": str(exc)})
                if time.monotonic() >= self.expires:
                    self.lost.set()
                    return
                continue
            if not ok:
                self.lost.set()
                return
            self.extended()


def _backoff(options: DurableGraphDriverOptions, failures: int) -> float:
    return capped_exponential(options.retry_backoff_seconds, options.max_retry_backoff_seconds, max(0, failures - 1))


def _waits_json(waits: tuple[Interrupt | Timer | Join, ...]) -> tuple[WaitRegistration, ...]:
    if not waits:
        raise InvalidInputError("waits", "a NodeWaits needs at least one wait")
    seen: set[str] = set()
    out: list[WaitRegistration] = []
    for wait in waits:
        if not isinstance(wait, Interrupt | Timer | Join):
            raise InvalidInputError("waits", f"{wait!r} is not an Interrupt, Timer or Join")
        if not wait.wait_id or len(wait.wait_id) > 128 or wait.wait_id in seen:
            raise InvalidInputError("waits.wait_id", f"{wait.wait_id!r} is empty, too long or repeated")
        seen.add(wait.wait_id)
        if isinstance(wait, Join):
            # One join per wait set: maintenance walks joins by (registration time, run), one item per run.
            if any(w["kind"] == "join" for w in out):
                raise InvalidInputError("waits", "a NodeWaits may hold at most one Join")
            out.append(join_json(wait))
        elif isinstance(wait, Timer):
            if not (0 <= wait.seconds <= 365 * 86400):
                raise InvalidInputError("waits.seconds", "must be between 0 and one year")
            out.append(
                {"wait_id": wait.wait_id, "kind": "timer", "payload": None, "timer_ms": int(wait.seconds * 1000)}
            )
        else:
            out.append(
                {"wait_id": wait.wait_id, "kind": "interrupt", "payload": json_clone(wait.payload), "timer_ms": None}
            )
    return tuple(sorted(out, key=lambda w: str(w["wait_id"])))


class DurableGraphDriver:
    """Runs a claimed run one node at a time; each node step is one fenced commit."""

    def __init__(
        self, store: AgentStore, executables: ExecutableGraphRegistry, options: DurableGraphDriverOptions
    ) -> None:
        self.store = store
        self.executables = executables
        self.options = options
        # Set by the worker that owns this driver: a liveness loss marks every lease of ours as lost.
        self.liveness: WorkerLiveness | None = None
        schemas = executables.schemas
        if GRAPH_DRIVER_EVENT_SCHEMA_ID not in schemas:
            raise InvalidInputError("schemas", f"the standard schema {GRAPH_DRIVER_EVENT_SCHEMA_ID} is not registered")
        self._schema = schemas.ref(GRAPH_DRIVER_EVENT_SCHEMA_ID)
        self.environments = EnvironmentBroker(store, options.environments) if options.environments else None

    @contextlib.asynccontextmanager
    async def _leased(self, claim: Claim) -> AsyncIterator[_Lease]:
        lease = _Lease(self.store, claim, self.options.lease_seconds)
        unwatch = self.liveness.watch(lease.lost) if self.liveness is not None else None
        task = asyncio.create_task(lease.run(), name=f"lease-{claim.key.run_id}")
        try:
            yield lease
        finally:
            if unwatch is not None:
                unwatch()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def drive(self, claim: Claim, shutdown: ShutdownSignal) -> Handoff:
        async with self._leased(claim) as lease:
            handoff = await self._drive(claim, shutdown, lease)
            if self.environments is not None:
                await self._settle_environments(handoff)
            return handoff

    async def _settle_environments(self, handoff: Handoff) -> None:
        """Still under the lease, before the handoff commits: a waiting run's Environments are paused, a
        finished run's deleted (a run that then fails to commit runs its node again, which resumes them)."""
        assert self.environments is not None
        ends = isinstance(handoff, SuccessHandoff | CancellationHandoff) or (
            isinstance(handoff, FailureHandoff) and not handoff.in_flight
        )
        try:
            if isinstance(handoff, WaitHandoff):
                await self.environments.pause_all(handoff.claim)
            elif ends:
                await self.environments.delete_all(handoff.claim)
        except AdxError as exc:
            log.warning(
                "could not settle the run's environments",
                extra={"run_id": str(handoff.claim.key.run_id), "error": str(exc)},
            )

    async def _drive(self, claim: Claim, shutdown: ShutdownSignal, lease: _Lease) -> Handoff:
        opts = self.options
        ck = claim.checkpoint
        step = ck.seq
        rev = claim.revision
        usage = dict(claim.usage)

        def failed(reason: str, attempt: uuid.UUID | None) -> FailureHandoff:
            # Closes over step and rev: a failure is handed off at the step the loop has reached.
            return FailureHandoff(claim, uuid.uuid4(), step, reason, attempt, revision=rev)

        if claim.cancel_requested:
            return CancellationHandoff(claim, uuid.uuid4(), step, None, usage, revision=rev)
        graph = self.executables.get(claim.graph_name, claim.graph_version)
        if claim.descriptor.get("graph_digest") != graph.digest:
            # This worker's registry differs from the one the run was admitted under: do not drive it.
            return ReleaseHandoff(
                claim,
                uuid.uuid4(),
                step,
                ReleaseKind.RECOVERY_RELEASED,
                f"graph digest mismatch for {graph.name}@{graph.version}",
                _backoff(opts, 6),
                None,
                None,
            )
        if ck.next_node is None:
            # The terminal-ready checkpoint is durable: finish without re-running any node.
            return SuccessHandoff(claim, uuid.uuid4(), step, ck.artifact, usage, revision=rev)
        budget = Budget(**claim.budget)
        node = ck.next_node
        failures = claim.prior_attempts
        if failures >= opts.max_node_attempts:
            return failed(f"quarantined: node {node!r} at step {step} was abandoned or failed {failures} times", None)
        state = ck.state
        wake = list(claim.wake) if ck.kind is CheckpointKind.WAIT else None
        attempt_id = await self.store.start_node_attempt(claim, node)
        nodes_run = 0
        while True:
            if usage["node_commits"] >= budget.max_steps:
                return failed(f"budget exhausted: max_steps={budget.max_steps}", attempt_id)
            ctx = NodeContext(
                self.store,
                self.executables,
                claim,
                node=node,
                step=step,
                attempt=failures + 1,
                budget=budget,
                usage=usage,
                wake=wake,
                environments=self.environments,
            )
            try:
                outcome = await self._run_node(graph, node, ctx, state, lease)
                if outcome is None:
                    outcome = Next()
                if isinstance(outcome, Fail):
                    return failed(str(outcome.reason)[:1024], attempt_id)
                if isinstance(outcome, NodeWaits):
                    waits = _waits_json(outcome.waits)
                    undeclared = [
                        w["wait_id"] for w in waits if w["kind"] == "interrupt" and w["wait_id"] not in graph.interrupts
                    ]
                    if graph.interrupts and undeclared:
                        raise InvalidInputError(
                            "waits.wait_id", f"interrupts {undeclared} are not declared by graph {graph.name!r}"
                        )
                    resume = outcome.resume_at or node
                    if resume not in graph.nodes:
                        raise InvalidInputError("resume_at", f"{resume!r} is not a node of {graph.name}")
                    new_state = graph.reduce(node, state, outcome.update)
                    return WaitHandoff(claim, uuid.uuid4(), step, attempt_id, resume, new_state, waits)
                if not isinstance(outcome, Next):
                    raise InvalidInputError("outcome", f"node {node!r} returned {type(outcome).__name__}")
                new_state = graph.reduce(node, state, outcome.update)
                target = graph.next_node(node, new_state, outcome.goto)
                artifact = json_clone(graph.terminal(new_state)) if target == END else None
            except (StaleFenceError, asyncio.CancelledError):
                raise
            except (BudgetExceededError, ToolOutcomeUnknownError) as exc:
                return failed(str(exc)[:1024], attempt_id)
            except Exception as exc:
                error = error_text(exc)
                if ctx.in_flight:
                    # AGT-7: work of this fence is in flight with an unknown outcome: hand it to recovery.
                    return FailureHandoff(claim, uuid.uuid4(), step, error, attempt_id, tuple(ctx.in_flight))
                failures += 1
                if failures >= opts.max_node_attempts:
                    return failed(f"node {node!r} failed {failures} times: {error}", attempt_id)
                return ReleaseHandoff(
                    claim,
                    uuid.uuid4(),
                    step,
                    ReleaseKind.DEFERRED,
                    error,
                    _backoff(opts, failures),
                    attempt_id,
                    AttemptStatus.FAILED,
                    error,
                )
            event_id = uuid.uuid4()
            next_node = None if target == END else target
            event = {
                "kind": "node_committed",
                "run_id": str(claim.key.run_id),
                "fence": claim.fence,
                "step": step + 1,
                "node": node,
                "next_node": next_node,
                "attempt_id": str(attempt_id),
                "state_digest": digest(new_state),
                "usage": {**ctx._usage, "node_commits": ctx._usage["node_commits"] + 1},
            }
            self.executables.schemas.validate(GRAPH_DRIVER_EVENT_SCHEMA_ID, event)
            result = await self.store.commit_node(
                claim,
                attempt_id=attempt_id,
                step=step,
                next_node=next_node,
                state=new_state,
                artifact=artifact,
                event_id=event_id,
                event=event,
                schema=self._schema,
                lease_s=opts.lease_seconds,
                hooks=ctx._hooks,
            )
            lease.extended()
            step += 1
            rev = result.revision
            usage = result.usage
            nodes_run += 1
            state, wake, failures = new_state, None, 0
            if next_node is None:
                return SuccessHandoff(claim, uuid.uuid4(), step, artifact, usage, revision=rev)
            assert result.next_attempt_id is not None
            attempt_id = result.next_attempt_id
            node = next_node
            if result.cancel_requested:
                return CancellationHandoff(claim, uuid.uuid4(), step, attempt_id, usage, revision=rev)
            # Between nodes the run is given back (its next node attempt skipped) when the worker stops or
            # this claim used its node quota, so other runs get their turn.
            stop = "worker shutting down" if shutdown.is_set() else None
            if stop is None and nodes_run >= opts.max_nodes_per_claim:
                stop = "node quota per claim used"
            if stop is not None:
                return ReleaseHandoff(
                    claim, uuid.uuid4(), step, ReleaseKind.YIELDED, stop, 0.0, attempt_id, AttemptStatus.SKIPPED
                )

    async def _run_node(self, graph: ExecutableGraph, node: str, ctx: NodeContext, state: Any, lease: _Lease) -> Any:
        """Run the node as a task raced against lease loss and the node timeout."""
        fn = graph.nodes[node].fn

        async def call() -> NodeOutcome | None:
            return await fn(ctx, json_clone(state))

        task: asyncio.Task[NodeOutcome | None] = asyncio.create_task(call(), name=f"node-{ctx.run_id}-{node}")
        lost = asyncio.create_task(lease.lost.wait())
        try:
            done, _ = await asyncio.wait(
                {task, lost}, timeout=self.options.node_timeout_seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if task in done:
            return task.result()
        if lease.lost.is_set():
            raise StaleFenceError(f"run {ctx.run_id}: lease lost while node {node!r} was running")
        raise TimeoutError(f"node {node!r} exceeded {self.options.node_timeout_seconds}s")
