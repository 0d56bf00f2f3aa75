"""Tool calls that survive worker crashes: a stable idempotency key per call and an optional reconcile hook.

A tool call is recorded (``started``) before it is dispatched and recorded again when it returns. A worker
that dies between the two leaves the call's outcome unknown. The next owner of the run then:

- replays a ``completed`` call from its record (the tool is not called again);
- calls an idempotent tool again, with the same :attr:`ToolCall.idempotency_key`;
- for a non-idempotent tool, asks its ``reconcile`` hook, which looks the key up where the tool's effect
  lives and answers :meth:`Reconciled.done` (the effect happened: its result is recorded and returned, the
  tool is not called again), :meth:`Reconciled.not_done` (the tool is called again, same key) or
  :meth:`Reconciled.fail` (the run fails with that reason). Without a hook the run fails (unknown outcome).
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeAlias

__all__ = ["ReconcileFn", "ReconcileOutcome", "Reconciled", "ToolCall", "ToolDef", "ToolFn", "takes_call"]

JSON: TypeAlias = Any


@dataclass(frozen=True, slots=True)
class ToolCall:
    """What a tool (and its reconcile hook) learns about the call it serves.

    ``idempotency_key`` is the same for every dispatch of this call of this run: the run, the step (the
    checkpoint the node runs from), the node, the tool and the call's ordinal within the node. Pass it to the
    external system (an ``Idempotency-Key`` header, a unique column, a file name) so a repeated dispatch is
    recognised there, and look it up in ``reconcile``.
    """

    idempotency_key: str
    tenant_id: str
    run_id: uuid.UUID
    step: int
    node: str
    tool: str
    ordinal: int
    fence: int


class ReconcileOutcome(StrEnum):
    DONE = "done"
    NOT_DONE = "not_done"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Reconciled:
    """A reconcile hook's answer about a call whose outcome was unknown."""

    outcome: ReconcileOutcome
    result: JSON = None
    reason: str = ""

    @classmethod
    def done(cls, result: JSON) -> Reconciled:
        """The effect happened; ``result`` is what the tool returned (or would have)."""
        return cls(ReconcileOutcome.DONE, result)

    @classmethod
    def not_done(cls) -> Reconciled:
        """The effect did not happen: dispatch the call again (same idempotency key)."""
        return cls(ReconcileOutcome.NOT_DONE)

    @classmethod
    def fail(cls, reason: str) -> Reconciled:
        """The outcome cannot be decided safely: fail the run with ``reason``."""
        return cls(ReconcileOutcome.FAIL, reason=reason)


#: ``async def tool(arguments)`` or ``async def tool(arguments, call: ToolCall)``.
ToolFn: TypeAlias = Callable[..., Awaitable[JSON]]
#: ``async def reconcile(arguments, call: ToolCall) -> Reconciled``.
ReconcileFn: TypeAlias = Callable[[JSON, ToolCall], Awaitable[Reconciled]]


@dataclass(frozen=True, slots=True)
class ToolDef:
    name: str
    fn: ToolFn
    idempotent: bool
    reconcile: ReconcileFn | None = None
    wants_call: bool = False

    async def dispatch(self, arguments: JSON, call: ToolCall) -> JSON:
        return await (self.fn(arguments, call) if self.wants_call else self.fn(arguments))


def takes_call(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` accepts a second positional argument (the :class:`ToolCall`)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)
