"""What a node sees while it runs (:class:`NodeContext`): its identity and wake-up, and the recorded calls it
makes (model, tool, child spawn, Environment) whose records make a node running again after a crash replay
them instead of repeating them."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from adx.agents._canonical import JsonObject, json_clone
from adx.agents._children import spawn_child
from adx.agents._environments import EnvironmentBroker, EnvironmentSpec, RunEnvironment
from adx.agents._errors import error_text
from adx.agents._graph import Budget, ChildRun, ExecutableGraphRegistry, ModelChunk, Usage
from adx.agents._pg import CommitHook
from adx.agents._rows import Claim
from adx.agents._status import AttemptStatus, Wake
from adx.agents._store import AgentStore
from adx.agents._tools import Reconciled, ReconcileOutcome, ToolCall, ToolDef
from adx.errors import ConflictError, InvalidInputError, UncertainOutcomeError

__all__ = ["BudgetExceededError", "ModelResult", "NodeContext", "ToolOutcomeUnknownError"]


class BudgetExceededError(ConflictError):
    """The run's resolved budget does not allow the next step or call (terminal failure, no retry)."""

    code = "budget_exceeded"


class ToolOutcomeUnknownError(ConflictError):
    """A non-idempotent tool call started by a lower fence has an unknown outcome: never re-dispatched."""

    code = "tool_outcome_unknown"


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
        budget: JsonObject | None = None,
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
            if previous.status is AttemptStatus.COMPLETED:
                usage = previous.usage
                return ModelResult(
                    previous.response["text"], Usage(**usage) if usage is not None else None, replayed=True
                )
        if self._budget.max_model_calls is not None and self._usage["model_calls"] >= self._budget.max_model_calls:
            raise BudgetExceededError(f"budget exhausted: max_model_calls={self._budget.max_model_calls}")
        spent = self._usage["input_tokens"] + self._usage["output_tokens"]
        if self._budget.max_tokens is not None and spent >= self._budget.max_tokens:
            raise BudgetExceededError(f"budget exhausted: max_tokens={self._budget.max_tokens}")
        attempt_id = await self._start("model", key, request)
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
            await self._finish(attempt_id, "model", error=error_text(exc))
            raise
        text = "".join(parts)
        usage_json = (
            {"input_tokens": usage_seen.input_tokens, "output_tokens": usage_seen.output_tokens}
            if usage_seen is not None
            else None  # never zero-filled: evidence refuses to finalise a run with unknown usage (AGT-3)
        )
        await self._finish(attempt_id, "model", response={"text": text}, usage=usage_json)
        self._usage["model_calls"] += 1
        if usage_seen is not None:
            self._usage["input_tokens"] += usage_seen.input_tokens
            self._usage["output_tokens"] += usage_seen.output_tokens
        return ModelResult(text, usage_seen, replayed=False)

    async def _start(self, kind: str, key: str, request: Any) -> uuid.UUID:
        """Record a call before it is dispatched (fenced); it is in flight until its outcome is recorded."""
        attempt_id = await self._store.start_call(
            self._claim.key,
            fence=self.fence,
            owner=self._claim.owner,
            step=self.step,
            node=self.node,
            kind=kind,
            call_key=key,
            request=request,
        )
        self.in_flight.add(attempt_id)
        return attempt_id

    async def _finish(
        self,
        attempt_id: uuid.UUID,
        kind: str,
        *,
        response: Any = None,
        usage: dict[str, int] | None = None,
        error: str | None = None,
    ) -> None:
        """Record a call's outcome (and count it when it completed); only then is it no longer in flight."""
        await self._store.finish_call(
            self._claim.key,
            attempt_id,
            fence=self.fence,
            owner=self._claim.owner,
            kind=kind,
            response=response,
            usage=usage,
            error=error,
        )
        self.in_flight.discard(attempt_id)

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
            if attempt.status is AttemptStatus.COMPLETED:
                return attempt.response
        unknown = [a for a in previous if a.status is AttemptStatus.STARTED and a.fence < self.fence]
        if unknown and not tool.idempotent:
            decided = await self._reconcile(tool, arguments, call, [a.attempt_id for a in unknown])
            if decided is not None:
                return decided.result
        attempt_id = await self._start("tool", key, arguments)
        try:
            result = await tool.dispatch(arguments, call)
        except UncertainOutcomeError:
            raise
        except Exception as exc:
            await self._finish(attempt_id, "tool", error=error_text(exc))
            raise
        await self._finish(attempt_id, "tool", response=result)
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
            await self._finish(
                attempt_id,
                "tool",
                response=json_clone(decided.result) if completes else None,
                error=None if completes else f"reconciled: {decided.outcome.value}",
            )
        if not done:
            return None
        self._usage["tool_calls"] += 1
        return decided
