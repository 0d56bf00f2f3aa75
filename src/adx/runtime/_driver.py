"""The RuntimeDriver protocol: what the adxlet needs from any runtime that runs Environment executions.

A driver never imports the node; the node talks to every driver through this protocol only (NOD-2: no
per-backend branches). Execution identity (``execution_id``) is chosen by the node and makes ``start``
idempotent; everything a driver needs to address an execution again after a node restart lives in
``Execution.native`` (which the node persists).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from adx.model import EnvironmentSpec, NetworkPolicy, Resources


@dataclass(frozen=True)
class ExecutionSpec:
    env_id: str
    generation: int
    execution_id: str
    spec: EnvironmentSpec
    #: The execution's secret in the runtime, fixed before the start so the node can store the execution's
    #: address first: a start or restore whose reply is lost (a crash mid-call) leaves nothing unaddressable.
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    #: The Environment's tenant: whose named volumes ``spec.volumes`` names.
    tenant: str = ""


@dataclass(frozen=True)
class Execution:
    env_id: str
    generation: int
    execution_id: str
    native: dict[str, Any]
    execd_socket: Path | None = None  # the host path of execd's client socket
    started_at: float = 0.0


class ExecutionState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    EXITED = "exited"
    MISSING = "missing"  # the runtime knows no such execution (only after a confirmed cleanup or never created)
    UNKNOWN = "unknown"  # the runtime could not be asked: never evidence of anything (SBX-6)


@dataclass(frozen=True)
class ExitInfo:
    exit_code: int | None = None
    signal: int | None = None
    oom_killed: bool = False
    reason: str = ""

    def describe(self) -> str:
        if self.oom_killed:
            return "killed: out of memory"
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        if self.exit_code is not None:
            return f"exited with status {self.exit_code}"
        return self.reason or "exited"


@dataclass(frozen=True)
class InventoryItem:
    execution_id: str
    env_id: str
    generation: int
    state: ExecutionState
    native: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecutionStats:
    """One reading of an execution's usage (MET-1): cumulative CPU time and current memory, disk, pids."""

    cpu_usage_seconds: float
    memory_bytes: int
    memory_peak_bytes: int
    memory_cache_bytes: int
    disk_bytes: int
    pids: int
    oom_kills: int
    observed_at: float


@dataclass(frozen=True)
class Artifact:
    """A published checkpoint artifact, as the runtime names it."""

    checkpoint_id: str
    location: str
    digest: str
    size_bytes: int
    created_at: float


@dataclass(frozen=True)
class DriverCapabilities:
    checkpoint_kinds: frozenset[str] = frozenset()
    network_isolation: bool = False

    @property
    def can_checkpoint(self) -> bool:
        return bool(self.checkpoint_kinds)


class RuntimeDriver(Protocol):
    name: str

    async def health(self) -> None:
        """Raise UnavailableError unless the runtime answers (the node waits for this at first start)."""

    def capabilities(self) -> DriverCapabilities: ...

    async def start(self, spec: ExecutionSpec) -> Execution:
        """Start (or, for a repeated ``execution_id``, return) an execution. Uncertain outcomes raise
        UncertainOutcomeError; the caller must then ``stop`` it to be sure nothing runs."""

    async def observe(self, execution: Execution) -> ExecutionState: ...

    async def wait_exit(self, execution: Execution) -> ExitInfo:
        """Long wait until the execution exits (CTL-4: no ordinary RPC deadline)."""

    async def stop(self, execution: Execution) -> None:
        """Stop and clean up; returns only when cleanup is confirmed (idempotent; gone counts as done)."""

    async def inventory(self) -> list[InventoryItem]:
        """Every execution this runtime holds for this node (startup recovery only)."""

    async def reclaim(self, item: InventoryItem, secret: str) -> Execution:
        """Make an execution of ``inventory`` addressable again when its address was lost (the node's record
        of it is gone): the runtime replaces the execution's secret by ``secret`` and returns its full
        address, as ``start`` does. The old secret stops working at once. Idempotent for a retry with the same
        ``secret`` (an uncertain outcome: retry with it, never with a new one before the old call is settled
        by a success). Raises NotFoundError for an execution that is gone (deleted or never existed),
        ConflictError when its generation is no longer ``item.generation``, InvalidInputError (field
        ``secret``) for a malformed secret. The execution's state is untouched: the caller adopts or stops it.
        """

    async def resources(self) -> Resources: ...

    async def checkpoint(self, execution: Execution, storage: str, within_seconds: float) -> Artifact:
        """Freeze the execution and publish a checkpoint of it to ``storage`` (a storage name the runtime
        knows, e.g. ``local`` or ``shared``). On success the execution stays frozen (the caller stops it); on
        failure it runs again and the error says why."""

    async def thaw(self, execution: Execution) -> None:
        """Let a frozen execution run again (a cancelled pause)."""

    def planned(self, spec: ExecutionSpec) -> Execution:
        """The address the execution a start or restore of ``spec`` creates will have, known before the call
        (the node records it first). It carries no execd socket: that is known once the start returns."""

    async def restore(self, spec: ExecutionSpec, location: str, digest: str) -> Execution:
        """Start a new execution from a checkpoint (verified against ``digest`` first)."""

    async def delete_checkpoint(self, location: str, digest: str) -> None:
        """Delete an artifact (idempotent: a missing one counts as deleted)."""

    async def stats(self, execution: Execution) -> ExecutionStats:
        """A reading of the execution's usage; the execution must be running."""

    async def checkpoint_roots(self) -> dict[str, str]:
        """Checkpoint storage name -> where that storage is on this host (shared storage may be mounted at a
        different path on each node)."""

    async def list_checkpoints(self, storage: str) -> list[Artifact]:
        """The whole artifacts this runtime captured in ``storage`` (never other nodes' in shared storage)."""

    async def network_namespace(self, execution: Execution) -> Path:
        """A path to the execution's network namespace (``/proc/<pid>/ns/net``): user ports are reached
        by connecting from inside it."""

    async def set_network(self, execution: Execution, policy: NetworkPolicy) -> None:
        """Replace a running execution's egress policy in place (no restart); ConflictError when it cannot
        change in place (an execution started without egress)."""
