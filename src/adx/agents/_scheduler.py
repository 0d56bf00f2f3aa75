"""The tenant scheduler: one bounded tick claims at most one run of one tenant and drives it.

A tick reads a fixed cutoff of the durable queue, walks keyset pages in queue order, gives every candidate a
stable claim-attempt ID, treats ordinary contention as a skip, and reports what it saw (AGT-11).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from enum import StrEnum

from adx.agents._driver import DurableGraphDriver, DurableGraphDriverOptions, ShutdownSignal
from adx.agents._errors import StaleFenceError
from adx.agents._graph import ExecutableGraphRegistry
from adx.agents._handoffs import ReleaseHandoff, ReleaseKind
from adx.agents._lifecycle import (
    DurableGraphLifecycle,
    DurableGraphLifecycleOptions,
    ExecutedOutcome,
    GraphLifecycleEvidenceProvider,
    LifecycleResult,
)
from adx.agents._options import require_between
from adx.agents._pg import check_tenant
from adx.agents._rows import Candidate, Claim, RunKey
from adx.agents._store import AgentStore
from adx.errors import AdxError, InvalidInputError, UnavailableError, UncertainOutcomeError

__all__ = [
    "DurableAgentLoop",
    "DurableTenantScheduler",
    "DurableTenantSchedulerOptions",
    "TickOutcome",
    "TickReport",
]

log = logging.getLogger("adx.agents.scheduler")


class TickOutcome(StrEnum):
    EXECUTED = "executed"
    EXECUTION_FAILED = "execution_failed"
    IDLE = "idle"
    SCAN_LIMIT_REACHED = "scan_limit_reached"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class DurableTenantSchedulerOptions:
    tenant_id: str = "default"
    page_size: int = 64
    max_pages: int = 16
    max_candidates: int = 1024
    max_contention: int = 64
    claim_retries: int = 3

    def __post_init__(self) -> None:
        check_tenant(self.tenant_id)
        require_between(self, 1, 100_000, "page_size", "max_pages", "max_candidates", "max_contention")
        require_between(self, 0, 100, "claim_retries")


@dataclass(frozen=True, slots=True)
class TickReport:
    outcome: TickOutcome
    executed: ExecutedOutcome | None = None
    run_id: uuid.UUID | None = None
    claim_attempt_id: uuid.UUID | None = None
    pages: int = 0
    candidates: int = 0
    contended: int = 0
    retries: int = 0
    error: str | None = None
    lifecycle: LifecycleResult | None = field(default=None, repr=False)


class DurableAgentLoop:
    """Driver and lifecycle over ONE store and ONE frozen registry (built only by the scheduler, AGT-1)."""

    def __init__(
        self,
        store: AgentStore,
        executables: ExecutableGraphRegistry,
        evidence: GraphLifecycleEvidenceProvider,
        driver_options: DurableGraphDriverOptions,
        lifecycle_options: DurableGraphLifecycleOptions,
    ) -> None:
        # Lifecycle first: it refuses to start without all three standard audit schemas (AGT-2).
        self.lifecycle = DurableGraphLifecycle(store, executables, evidence, lifecycle_options)
        self.driver = DurableGraphDriver(store, executables, driver_options)

    async def run(self, claim: Claim, shutdown: ShutdownSignal) -> LifecycleResult:
        handoff = await self.driver.drive(claim, shutdown)
        return await self.lifecycle.commit(handoff)


def _new_identity() -> str:
    # A fresh identity per process and scheduler: a restarted worker never inherits old claims by name.
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class DurableTenantScheduler:
    def __init__(
        self,
        store: AgentStore,
        executables: ExecutableGraphRegistry,
        evidence_provider: GraphLifecycleEvidenceProvider,
        driver_options: DurableGraphDriverOptions | None = None,
        lifecycle_options: DurableGraphLifecycleOptions | None = None,
        options: DurableTenantSchedulerOptions | None = None,
    ) -> None:
        if not isinstance(executables, ExecutableGraphRegistry) or not executables.frozen:
            raise InvalidInputError("executables", "must be a built (frozen) ExecutableGraphRegistry")
        self.store = store
        self.executables = executables
        self.driver_options = driver_options or DurableGraphDriverOptions()
        self.lifecycle_options = lifecycle_options or DurableGraphLifecycleOptions()
        self.options = options or DurableTenantSchedulerOptions()
        self.loop = DurableAgentLoop(store, executables, evidence_provider, self.driver_options, self.lifecycle_options)
        self.identity = _new_identity()
        self._namespace = uuid.uuid5(uuid.NAMESPACE_URL, f"urn:adx:agent-worker:{self.identity}")
        self._tick_seq = 0
        self._worker_owned = False  # set by the AgentWorker that owns this scheduler

    @property
    def tenant_id(self) -> str:
        return self.options.tenant_id

    def claim_attempt_id(self, tick_seq: int, candidate: Candidate) -> uuid.UUID:
        """Stable for one candidate within one tick: retries of an uncertain claim reuse it."""
        return uuid.uuid5(self._namespace, f"{tick_seq}:{candidate.run_id}:{candidate.revision}")

    async def _claim(self, candidate: Candidate, claim_id: uuid.UUID) -> tuple[Claim | None, int]:
        key = RunKey(self.tenant_id, candidate.run_id)
        retries = 0
        while True:
            try:
                return (
                    await self.store.claim(
                        key,
                        revision=candidate.revision,
                        owner=self.identity,
                        claim_id=claim_id,
                        lease_s=self.driver_options.lease_seconds,
                    ),
                    retries,
                )
            except UncertainOutcomeError:
                # Lost ACK of the claim itself: the stable claim ID tells whether it landed.
                if retries >= self.options.claim_retries:
                    raise
                retries += 1
                try:
                    found = await self.store.find_claim(key, owner=self.identity, claim_id=claim_id)
                except UnavailableError:
                    continue
                if found is not None:
                    return found, retries
            except UnavailableError:
                if retries >= self.options.claim_retries:
                    raise
                retries += 1
                await asyncio.sleep(0.05 * retries)

    async def tick(self, shutdown: ShutdownSignal | None = None) -> TickReport:
        """One bounded scheduling step; see :class:`TickOutcome`."""
        signal = shutdown or ShutdownSignal()
        self._tick_seq += 1
        tick_seq = self._tick_seq
        opts = self.options
        if signal.is_set():
            return TickReport(TickOutcome.CANCELLED)
        cutoff = await self.store.scan_cutoff()
        after = pages = decoded = contended = retries = 0

        def scanned(outcome: TickOutcome) -> TickReport:
            # Reads the counters when called: a report carries how far this tick's scan got.
            return TickReport(outcome, pages=pages, candidates=decoded, contended=contended, retries=retries)

        while True:
            if pages >= opts.max_pages:
                return scanned(TickOutcome.SCAN_LIMIT_REACHED)
            page = await self.store.scan_page(self.tenant_id, cutoff, after, opts.page_size)
            pages += 1
            for candidate in page:
                if decoded >= opts.max_candidates or contended >= opts.max_contention:
                    return scanned(TickOutcome.SCAN_LIMIT_REACHED)
                decoded += 1
                if not candidate.claimable:
                    continue
                if signal.is_set():
                    return scanned(TickOutcome.CANCELLED)
                claim_id = self.claim_attempt_id(tick_seq, candidate)
                claim, used = await self._claim(candidate, claim_id)
                retries += used
                if claim is None:
                    contended += 1  # another worker got there first, or the row moved on: skip it
                    continue
                return await self._execute(claim, signal, pages, decoded, contended, retries)
            if len(page) < opts.page_size:
                return scanned(TickOutcome.IDLE)
            after = page[-1].queue_seq

    async def _execute(
        self, claim: Claim, signal: ShutdownSignal, pages: int, decoded: int, contended: int, retries: int
    ) -> TickReport:
        def report(outcome: TickOutcome, result: LifecycleResult | None = None, error: str | None = None) -> TickReport:
            return TickReport(
                outcome,
                executed=result.outcome if result is not None else None,
                run_id=claim.key.run_id,
                claim_attempt_id=claim.claim_id,
                pages=pages,
                candidates=decoded,
                contended=contended,
                retries=retries,
                error=error,
                lifecycle=result,
            )

        try:
            result = await self.loop.run(claim, signal)
        except StaleFenceError as exc:
            # We lost the run (higher fence or expired lease): nothing of ours is left to clean.
            return report(TickOutcome.EXECUTION_FAILED, error=str(exc))
        except AdxError as exc:
            await self._cleanup(claim, exc)
            return report(TickOutcome.EXECUTION_FAILED, error=str(exc))
        except Exception as exc:  # a bug in application code or here: keep the worker alive, release the run
            log.exception("run-local execution error", extra={"run_id": str(claim.key.run_id)})
            await self._cleanup(claim, exc)
            return report(TickOutcome.EXECUTION_FAILED, error=f"{type(exc).__name__}: {exc}")
        return report(TickOutcome.EXECUTED, result)

    async def _cleanup(self, claim: Claim, exc: BaseException) -> None:
        """Try to release the exact fence; if that fails too, the lease simply expires."""
        try:
            await self.loop.lifecycle.commit_release(
                ReleaseHandoff(
                    claim,
                    uuid.uuid4(),
                    claim.checkpoint.seq,
                    ReleaseKind.RECOVERY_RELEASED,
                    f"execution error: {exc}"[:1024],
                    self.lifecycle_options.evidence_retry_seconds,
                    None,
                    None,
                )
            )
        except (AdxError, OSError) as cleanup_error:
            log.warning(
                "could not release run after an execution error",
                extra={"run_id": str(claim.key.run_id), "error": str(cleanup_error)},
            )
