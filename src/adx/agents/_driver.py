"""The graph driver: runs one claimed run node by node, checkpointing after each, and returns a handoff.

The driver never finalises a run. It returns an exact *handoff* (wait, success, failure, cancellation or
release) carrying a lifecycle event identity assigned once here; :mod:`adx.agents._lifecycle` commits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from adx._backoff import capped_exponential
from adx.agents._canonical import digest, json_clone
from adx.agents._children import join_json, spawn_child
from adx.agents._environments import EnvironmentAccess, EnvironmentBroker, EnvironmentSpec, RunEnvironment
from adx.agents._errors import StaleFenceError
from adx.agents._graph import (
    END,
    Budget,
    ChildRun,
    ExecutableGraph,
    ExecutableGraphRegistry,
    Fail,
    Interrupt,
    Join,
    ModelChunk,
    Next,
    NodeOutcome,
    NodeWaits,
    Timer,
    Usage,
)
from adx.agents._pg import CommitHook
from adx.agents._rows import Claim
from adx.agents._schemas import GRAPH_DRIVER_EVENT_SCHEMA_ID
from adx.agents._status import Wake
from adx.agents._store import AgentStore
from adx.agents._tools import Reconciled, ReconcileOutcome, ToolCall, ToolDef
from adx.errors import AdxError, ConflictError, InvalidInputError, UncertainOutcomeError

if TYPE_CHECKING:
    from adx.agents._liveness import WorkerLiveness

__all__ = [
    "BudgetExceededError",
    "CancellationHandoff",
    "DurableGraphDriver",
    "DurableGraphDriverOptions",
    "FailureHandoff",
    "Handoff",
    "ModelResult",
    "NodeContext",
    "ReleaseHandoff",
    "ReleaseKind",
    "ShutdownSignal",
    "SuccessHandoff",
    "ToolOutcomeUnknownError",
    "WaitHandoff",
]

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
        for name in ("lease_seconds", "node_timeout_seconds", "retry_backoff_seconds", "max_retry_backoff_seconds"):
            if not getattr(self, name) > 0:
                raise InvalidInputError(name, "must be positive")
        for name in ("max_node_attempts", "max_nodes_per_claim"):
            if getattr(self, name) < 1:
                raise InvalidInputError(name, "must be at least 1")


class BudgetExceededError(ConflictError):
    """The run's resolved budget does not allow the next step or call (terminal failure, no retry)."""

    code = "budget_exceeded"


class ToolOutcomeUnknownError(ConflictError):
    """A non-idempotent tool call started by a lower fence has an unknown outcome: never re-dispatched."""

    code = "tool_outcome_unknown"


class ReleaseKind(StrEnum):
    DEFERRED = "deferred"
    YIELDED = "yielded"
    RECOVERY_RELEASED = "recovery_released"


@dataclass(frozen=True, slots=True)
class WaitHandoff:
    claim: Claim
    event_id: uuid.UUID
    step: int
    attempt_id: uuid.UUID
    resume_node: str
    state: Any
    waits: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class SuccessHandoff:
    claim: Claim
    event_id: uuid.UUID
    step: int
    artifact: Any
    usage: dict[str, int]
    revision: int = 0  # the run revision the driver last committed or claimed (AGT-9 replay expects + 1)


@dataclass(frozen=True, slots=True)
class FailureHandoff:
    claim: Claim
    event_id: uuid.UUID
    step: int
    reason: str
    attempt_id: uuid.UUID | None
    in_flight: tuple[uuid.UUID, ...] = ()
    revision: int = 0


@dataclass(frozen=True, slots=True)
class CancellationHandoff:
    claim: Claim
    event_id: uuid.UUID
    step: int
    attempt_id: uuid.UUID | None
    usage: dict[str, int]
    revision: int = 0


@dataclass(frozen=True, slots=True)
class ReleaseHandoff:
    claim: Claim
    event_id: uuid.UUID
    step: int
    kind: ReleaseKind
    reason: str
    delay_s: float
    attempt_id: uuid.UUID | None
    attempt_status: str | None
    error: str | None = None


Handoff = WaitHandoff | SuccessHandoff | FailureHandoff | CancellationHandoff | ReleaseHandoff


@dataclass(frozen=True, slots=True)
class ModelResult:
    text: str
    usage: Usage | None
    replayed: bool


class NodeContext:
    """What a node sees: identity, wake-up information, recorded model/tool calls, commit hooks."""

    def __init__(
        self,
        store: AgentStore,
        executables: ExecutableGraphRegistry,
        claim: Claim,
        *,
        node: str,
        step: int,
        attempt: int,
        budget: Budget,
        usage: dict[str, int],
        wake: list[Wake] | None,
        environments: EnvironmentBroker | None = None,
    ) -> None:
        self._store = store
        self._environments = environments
        self._executables = executables
        self._claim = claim
        self.node = node
        self.step = step
        self.attempt = attempt
        self.wake = wake
        self.request: Any = json_clone(claim.request)
        self._budget = budget
        self._usage = dict(usage)
        self._ordinals: dict[str, int] = {}
        self._hooks: list[CommitHook] = []
        self.in_flight: set[uuid.UUID] = set()

    @property
    def run_id(self) -> uuid.UUID:
        return self._claim.key.run_id

    @property
    def tenant_id(self) -> str:
        return self._claim.key.tenant_id

    @property
    def fence(self) -> int:
        return self._claim.fence

    def on_commit(self, hook: CommitHook) -> None:
        """Run ``hook(conn)`` inside the transaction that commits this node: its writes *on ``conn``* commit
        exactly when the node's checkpoint does, once. Anything else the hook does (files, HTTP, other
        connections) happens at every commit attempt, also one whose transaction then fails to commit, after which
        the node and its hook run again: use a tool with ``reconcile`` for those."""
        self._hooks.append(hook)

    async def environment(
        self, name: str = "main", spec: EnvironmentSpec | None = None, *, keep: bool = False
    ) -> RunEnvironment:
        """The run's ADX Environment ``name``, created from ``spec`` when the run has none of that name yet,
        reattached (and resumed) when it has: after a crash, in a later node, after a wait. Its ID is committed
        before the create is seen complete. Deleted when the run ends, unless ``keep``."""
        if self._environments is None:
            raise InvalidInputError(
                "environments", "this worker has no ADX API configured for ctx.environment (its [environments])"
            )
        return await self._environments.open(self._claim, name, spec or EnvironmentSpec(), keep)

    async def spawn(
        self,
        graph: str,
        input: Any,
        *,
        version: str | None = None,
        key: str | None = None,
        budget: dict[str, Any] | None = None,
        deadline_seconds: float | None = None,
    ) -> ChildRun:
        """Admit a child run of ``graph`` (this worker's registry; ``version`` may be omitted when it has one
        version) with ``input``; wait for children with a :class:`Join`. The child's ID is derived from this run,
        step and ``key`` (default: the graph name and the spawn's ordinal in this node), so this node running
        again after a crash gets the same child back instead of a second one. The spawn is fenced: a worker
        that lost this run spawns nothing (StaleFenceError)."""
        if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 128):
            raise InvalidInputError("key", "must be 1-128 characters")
        return await spawn_child(
            self._store,
            self._executables,
            self._claim,
            step=self.step,
            call_key=self._call_key("spawn", graph) if key is None else f"spawn-key:{key}",
            graph=graph,
            version=version,
            input=input,
            budget=budget,
            deadline_seconds=deadline_seconds,
        )

    def _call_key(self, kind: str, name: str) -> str:
        ordinal = self._ordinals.get(f"{kind}:{name}", 0)
        self._ordinals[f"{kind}:{name}"] = ordinal + 1
        return f"{kind}:{name}#{ordinal}"

    async def model(
        self, provider: str, request: Any, *, on_chunk: Callable[[ModelChunk], Awaitable[None]] | None = None
    ) -> ModelResult:
        """Call a registered model provider (streaming). Recorded before dispatch; a completed call of an
        earlier attempt of this step is replayed from the record instead of being called again."""
        model = self._executables.models.get(provider)
        if model is None:
            raise InvalidInputError("provider", f"model provider {provider!r} is not registered")
        key = self._call_key("model", provider)
        for previous in await self._store.find_call(self._claim.key, self.step, "model", key):
            if previous["status"] == "completed":
                usage = previous["usage"]
                return ModelResult(
                    previous["response"]["text"], Usage(**usage) if usage is not None else None, replayed=True
                )
        if self._budget.max_model_calls is not None and self._usage["model_calls"] >= self._budget.max_model_calls:
            raise BudgetExceededError(f"budget exhausted: max_model_calls={self._budget.max_model_calls}")
        spent = self._usage["input_tokens"] + self._usage["output_tokens"]
        if self._budget.max_tokens is not None and spent >= self._budget.max_tokens:
            raise BudgetExceededError(f"budget exhausted: max_tokens={self._budget.max_tokens}")
        attempt_id = await self._store.start_call(
            self._claim.key,
            fence=self.fence,
            owner=self._claim.owner,
            step=self.step,
            node=self.node,
            kind="model",
            call_key=key,
            request=request,
        )
        self.in_flight.add(attempt_id)
        parts: list[str] = []
        usage_seen: Usage | None = None
        try:
            async for chunk in model.stream(request):
                parts.append(chunk.text)
                if chunk.usage is not None:
                    usage_seen = chunk.usage
                if on_chunk is not None:
                    await on_chunk(chunk)
        except UncertainOutcomeError:
            raise  # stays in flight: the lifecycle hands it to higher-fence recovery
        except Exception as exc:
            await self._store.finish_call(
                self._claim.key,
                attempt_id,
                fence=self.fence,
                owner=self._claim.owner,
                kind="model",
                response=None,
                usage=None,
                error=f"{type(exc).__name__}: {exc}"[:1024],
            )
            self.in_flight.discard(attempt_id)
            raise
        text = "".join(parts)
        usage_json = (
            {"input_tokens": usage_seen.input_tokens, "output_tokens": usage_seen.output_tokens}
            if usage_seen is not None
            else None  # never zero-filled: evidence refuses to finalise a run with unknown usage (AGT-3)
        )
        await self._store.finish_call(
            self._claim.key,
            attempt_id,
            fence=self.fence,
            owner=self._claim.owner,
            kind="model",
            response={"text": text},
            usage=usage_json,
        )
        self.in_flight.discard(attempt_id)
        self._usage["model_calls"] += 1
        if usage_seen is not None:
            self._usage["input_tokens"] += usage_seen.input_tokens
            self._usage["output_tokens"] += usage_seen.output_tokens
        return ModelResult(text, usage_seen, replayed=False)

    def _tool_call(self, name: str, key: str) -> ToolCall:
        ordinal = int(key.rsplit("#", 1)[1])
        return ToolCall(
            idempotency_key=f"{self.run_id}/{self.step}/{self.node}/{name}#{ordinal}",
            tenant_id=self.tenant_id,
            run_id=self.run_id,
            step=self.step,
            node=self.node,
            tool=name,
            ordinal=ordinal,
            fence=self.fence,
        )

    async def tool(self, name: str, arguments: Any) -> Any:
        """Call a registered tool, recorded before dispatch; completed calls are replayed from the record.

        The tool gets the same :attr:`ToolCall.idempotency_key` at every dispatch of this call; a
        non-idempotent tool's unknown outcome (its worker died mid-call) is decided by its ``reconcile``."""
        tool = self._executables.tools.get(name)
        if tool is None:
            raise InvalidInputError("tool", f"tool {name!r} is not registered")
        key = self._call_key("tool", name)
        call = self._tool_call(name, key)
        previous = await self._store.find_call(self._claim.key, self.step, "tool", key)
        for attempt in previous:
            if attempt["status"] == "completed":
                return attempt["response"]
        unknown = [a for a in previous if a["status"] == "started" and a["fence"] < self.fence]
        if unknown and not tool.idempotent:
            decided = await self._reconcile(tool, arguments, call, [a["attempt_id"] for a in unknown])
            if decided is not None:
                return decided.result
        attempt_id = await self._store.start_call(
            self._claim.key,
            fence=self.fence,
            owner=self._claim.owner,
            step=self.step,
            node=self.node,
            kind="tool",
            call_key=key,
            request=arguments,
        )
        self.in_flight.add(attempt_id)
        try:
            result = await tool.dispatch(arguments, call)
        except UncertainOutcomeError:
            raise
        except Exception as exc:
            await self._store.finish_call(
                self._claim.key,
                attempt_id,
                fence=self.fence,
                owner=self._claim.owner,
                kind="tool",
                response=None,
                usage=None,
                error=f"{type(exc).__name__}: {exc}"[:1024],
            )
            self.in_flight.discard(attempt_id)
            raise
        await self._store.finish_call(
            self._claim.key,
            attempt_id,
            fence=self.fence,
            owner=self._claim.owner,
            kind="tool",
            response=result,
            usage=None,
        )
        self.in_flight.discard(attempt_id)
        self._usage["tool_calls"] += 1
        return result

    async def _reconcile(
        self, tool: ToolDef, arguments: Any, call: ToolCall, unknown: list[uuid.UUID]
    ) -> Reconciled | None:
        """Decide the unknown outcome of earlier dispatches; returns the decision when the call is done."""
        if tool.reconcile is None:
            raise ToolOutcomeUnknownError(
                f"tool {tool.name!r} call {call.idempotency_key} started under an earlier owner has an unknown"
                " outcome and the tool has no reconcile hook"
            )
        decided = await tool.reconcile(arguments, call)
        if not isinstance(decided, Reconciled):
            raise InvalidInputError(f"tools.{tool.name}.reconcile", f"returned {decided!r}, not a Reconciled")
        if decided.outcome is ReconcileOutcome.FAIL:
            raise ToolOutcomeUnknownError(f"tool {tool.name!r} call {call.idempotency_key}: {decided.reason}"[:1024])
        done = decided.outcome is ReconcileOutcome.DONE
        for index, attempt_id in enumerate(unknown):
            # One completed record per call (the latest dispatch); the others are closed as reconciled.
            completes = done and index == len(unknown) - 1
            await self._store.finish_call(
                self._claim.key,
                attempt_id,
                fence=self.fence,
                owner=self._claim.owner,
                kind="tool",
                response=json_clone(decided.result) if completes else None,
                usage=None,
                error=None if completes else f"reconciled: {decided.outcome.value}",
            )
        if not done:
            return None
        self._usage["tool_calls"] += 1
        return decided


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


def _waits_json(waits: tuple[Interrupt | Timer | Join, ...]) -> tuple[dict[str, Any], ...]:
    if not waits:
        raise InvalidInputError("waits", "a NodeWaits needs at least one wait")
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
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
        self._schema = (GRAPH_DRIVER_EVENT_SCHEMA_ID, schemas.digest(GRAPH_DRIVER_EVENT_SCHEMA_ID))
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
            return FailureHandoff(
                claim,
                uuid.uuid4(),
                step,
                f"quarantined: node {node!r} at step {step} was abandoned or failed {failures} times",
                None,
                revision=rev,
            )
        state = ck.state
        wake = [Wake.from_row(w) for w in claim.wake] if ck.kind == "wait" else None
        attempt_id = await self.store.start_node_attempt(claim, node)
        nodes_run = 0
        while True:
            if usage["node_commits"] >= budget.max_steps:
                return FailureHandoff(
                    claim,
                    uuid.uuid4(),
                    step,
                    f"budget exhausted: max_steps={budget.max_steps}",
                    attempt_id,
                    revision=rev,
                )
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
                    return FailureHandoff(
                        claim, uuid.uuid4(), step, str(outcome.reason)[:1024], attempt_id, revision=rev
                    )
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
                return FailureHandoff(claim, uuid.uuid4(), step, str(exc)[:1024], attempt_id, revision=rev)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:1024]
                if ctx.in_flight:
                    # AGT-7: work of this fence is in flight with an unknown outcome: hand it to recovery.
                    return FailureHandoff(claim, uuid.uuid4(), step, error, attempt_id, tuple(ctx.in_flight))
                failures += 1
                if failures >= opts.max_node_attempts:
                    return FailureHandoff(
                        claim,
                        uuid.uuid4(),
                        step,
                        f"node {node!r} failed {failures} times: {error}",
                        attempt_id,
                        revision=rev,
                    )
                return ReleaseHandoff(
                    claim,
                    uuid.uuid4(),
                    step,
                    ReleaseKind.DEFERRED,
                    error,
                    _backoff(opts, failures),
                    attempt_id,
                    "failed",
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
            if shutdown.is_set():
                return ReleaseHandoff(
                    claim, uuid.uuid4(), step, ReleaseKind.YIELDED, "worker shutting down", 0.0, attempt_id, "skipped"
                )
            if nodes_run >= opts.max_nodes_per_claim:
                return ReleaseHandoff(
                    claim,
                    uuid.uuid4(),
                    step,
                    ReleaseKind.YIELDED,
                    "node quota per claim used",
                    0.0,
                    attempt_id,
                    "skipped",
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
