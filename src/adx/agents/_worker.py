"""The agent worker: fixed slots of bounded ticks over one scheduler, gated by a mandatory readiness check.

Shutdown is not run cancellation nor rollback: :meth:`AgentWorker.begin_shutdown` stops admission (no new
claims; running drivers yield their run at the next node boundary), :meth:`AgentWorker.shutdown` waits up to
the drain period, then force-aborts the remaining ticks and node tasks and waits for them to exit. A run whose
tick was aborted keeps its last checkpoint; its lease expires and a higher fence continues it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from adx.agents._driver import ShutdownSignal
from adx.agents._fair import DurableFairScheduler
from adx.agents._liveness import WorkerLiveness
from adx.agents._options import require_between, require_positive
from adx.agents._scheduler import DurableTenantScheduler, TickOutcome
from adx.agents._store import AgentStore
from adx.errors import AdxError, ConflictError, InvalidInputError, UnavailableError

__all__ = [
    "AgentWorker",
    "AgentWorkerBinding",
    "AgentWorkerHealth",
    "AgentWorkerOptions",
    "AgentWorkerReadiness",
]

log = logging.getLogger("adx.agents.worker")


@dataclass(frozen=True, slots=True)
class AgentWorkerOptions:
    slots: int = 4
    tick_deadline_seconds: float = 300.0
    drain_seconds: float = 30.0
    idle_poll_seconds: float = 0.5
    error_backoff_seconds: float = 1.0
    #: A dead worker's runs are claimable this long after its last heartbeat (instead of after its lease);
    #: None turns liveness off (e.g. behind a transaction-pooling proxy, where session locks do not hold).
    liveness_grace_seconds: float | None = 1.0

    def __post_init__(self) -> None:
        require_between(self, 1, 1024, "slots")
        if self.liveness_grace_seconds is not None and not 0 < self.liveness_grace_seconds <= 3600:
            raise InvalidInputError("liveness_grace_seconds", "must be between 0 (exclusive) and 3600, or None")
        require_positive(self, "tick_deadline_seconds", "drain_seconds", "idle_poll_seconds", "error_backoff_seconds")


@dataclass(frozen=True, slots=True)
class AgentWorkerReadiness:
    """A mandatory, periodic check of the worker's real host dependencies.

    ``check`` raises (or returns False) when a dependency is not ready. A passing check is evidence for
    ``ttl_seconds``; expired or failing evidence pauses new ticks. Checks run one at a time, never overlapping.
    """

    check: Callable[[], Awaitable[bool | None]]
    _: KW_ONLY
    interval_seconds: float = 5.0
    ttl_seconds: float = 15.0
    timeout_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.interval_seconds < self.ttl_seconds:
            raise InvalidInputError("interval_seconds", "must be positive and shorter than ttl_seconds")
        require_positive(self, "timeout_seconds")

    @classmethod
    def database(cls, store: AgentStore, **kwargs: float) -> AgentWorkerReadiness:
        """Ready when PostgreSQL answers and the runtime schema is the one this build expects."""

        async def check() -> bool:
            await store.check_schema()
            return True

        return cls(check, **kwargs)

    async def probe(self, logger: logging.Logger) -> bool:
        """Run the check once, within ``timeout_seconds``: False when it fails, times out or returns False.

        An application check's own bug counts as not ready, never as ready (and never stops the role)."""
        try:
            ok = await asyncio.wait_for(self.check(), timeout=self.timeout_seconds)
        except (AdxError, OSError, TimeoutError) as exc:
            logger.warning("readiness check failed", extra={"error": str(exc)})
            return False
        except Exception as exc:
            logger.warning("readiness check raised", extra={"error": f"{type(exc).__name__}: {exc}"})
            return False
        return ok is not False


@dataclass(frozen=True, slots=True)
class AgentWorkerBinding:
    """Which scheduler a worker owns: one tenant's, or a fair scheduler over several tenants' (AGT-12)."""

    kind: str
    scheduler: DurableTenantScheduler | DurableFairScheduler

    @classmethod
    def tenant(cls, scheduler: DurableTenantScheduler) -> AgentWorkerBinding:
        if not isinstance(scheduler, DurableTenantScheduler):
            raise InvalidInputError("scheduler", "must be a DurableTenantScheduler")
        return cls("tenant", scheduler)

    @classmethod
    def fair(cls, scheduler: DurableFairScheduler) -> AgentWorkerBinding:
        if not isinstance(scheduler, DurableFairScheduler):
            raise InvalidInputError("scheduler", "must be a DurableFairScheduler")
        return cls("fair", scheduler)

    @property
    def tenant_schedulers(self) -> list[DurableTenantScheduler]:
        s = self.scheduler
        return list(s.tenant_schedulers) if isinstance(s, DurableFairScheduler) else [s]


@dataclass(frozen=True, slots=True)
class AgentWorkerHealth:
    """Local state and counters; never request content, never a durable record."""

    state: str
    identity: str
    binding: str
    tenant_id: str
    ready: bool
    slots: int
    busy_slots: int
    ticks: dict[str, int]
    executed: dict[str, int]
    tick_timeouts: int
    tick_errors: int
    readiness_checks: int
    readiness_failures: int
    uptime_seconds: float


@dataclass
class _Counters:
    ticks: Counter[str] = field(default_factory=Counter)
    executed: Counter[str] = field(default_factory=Counter)
    tick_timeouts: int = 0
    tick_errors: int = 0
    readiness_checks: int = 0
    readiness_failures: int = 0


class AgentWorker:
    """Create with :meth:`start` (verifies schema, registry and readiness before the first claim)."""

    def __init__(
        self, binding: AgentWorkerBinding, readiness: AgentWorkerReadiness, options: AgentWorkerOptions
    ) -> None:
        if not isinstance(readiness, AgentWorkerReadiness):
            raise InvalidInputError("readiness", "an AgentWorkerReadiness is mandatory")
        self.binding = binding
        self.scheduler = binding.scheduler
        self.readiness = readiness
        self.options = options
        self._signal = ShutdownSignal()
        self._counters = _Counters()
        self._busy = 0
        self._ready_until = 0.0
        self._ready = asyncio.Event()
        self._slots: list[asyncio.Task[None]] = []
        self._checker: asyncio.Task[None] | None = None
        self._liveness: WorkerLiveness | None = None
        self._done: asyncio.Future[None] | None = None
        self._state = "created"
        self._started = time.monotonic()

    @classmethod
    async def start(
        cls,
        binding: AgentWorkerBinding,
        readiness: AgentWorkerReadiness,
        options: AgentWorkerOptions | None = None,
    ) -> AgentWorker:
        worker = cls(binding, readiness, options or AgentWorkerOptions())
        await worker._start()
        return worker

    async def _start(self) -> None:
        scheduler = self.scheduler
        # A binding owns its scheduler: two workers ticking one scheduler would share its identity and claims.
        if getattr(scheduler, "_worker_owned", False):
            raise ConflictError("this scheduler is already owned by a worker")
        scheduler._worker_owned = True
        # AGT-13: verify the real database schema and the frozen registry before any claim.
        try:
            await scheduler.store.check_schema()
            for tenant_scheduler in self.binding.tenant_schedulers:
                await tenant_scheduler.store.check_schema()
                if not tenant_scheduler.executables.frozen:
                    raise ConflictError("executable registry is not frozen")
            if isinstance(scheduler, DurableFairScheduler):
                await scheduler.verify_policy()  # refuses a policy that differs from the persisted one
            if not await self._check_once():
                raise UnavailableError("agent worker readiness check failed at start")
            if self.options.liveness_grace_seconds is not None:
                self._liveness = WorkerLiveness(
                    scheduler.store,
                    scheduler.identity,
                    scheduler.tenant_id,
                    grace_seconds=self.options.liveness_grace_seconds,
                    drain_seconds=self.options.drain_seconds,
                )
                await self._liveness.start()
                for tenant_scheduler in self.binding.tenant_schedulers:
                    tenant_scheduler.loop.driver.liveness = self._liveness
        except BaseException:
            scheduler._worker_owned = False  # a worker that never started owns nothing
            raise
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._checker = asyncio.create_task(self._readiness_loop(), name="agent-worker-readiness")
        self._slots = [
            asyncio.create_task(self._slot(i), name=f"agent-worker-slot-{i}") for i in range(self.options.slots)
        ]
        self._state = "running"
        supervisor = asyncio.gather(*self._slots, return_exceptions=True)
        supervisor.add_done_callback(self._finished)
        log.info("agent worker started", extra={"identity": scheduler.identity, "slots": self.options.slots})

    def _finished(self, _: Any) -> None:
        self._state = "stopped"
        if self._checker is not None:
            self._checker.cancel()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    # --- readiness ---------------------------------------------------------------------------------------

    async def _check_once(self) -> bool:
        self._counters.readiness_checks += 1
        if not await self.readiness.probe(log):
            self._counters.readiness_failures += 1
            self._ready_until = 0.0
            self._ready.clear()
            return False
        self._ready_until = time.monotonic() + self.readiness.ttl_seconds
        self._ready.set()
        return True

    async def _readiness_loop(self) -> None:
        # One task runs every check in sequence: checks never overlap.
        while not await self._signal.sleep(self.readiness.interval_seconds):
            await self._check_once()

    def _is_ready(self) -> bool:
        if time.monotonic() >= self._ready_until:
            self._ready.clear()  # expired evidence pauses new ticks until a check passes again
        if self._liveness is not None and not self._liveness.healthy:
            return False  # our runs may be reclaimed by others: claim nothing until we are registered again
        return self._ready.is_set()

    # --- slots -------------------------------------------------------------------------------------------

    async def _slot(self, index: int) -> None:
        opts = self.options
        while not self._signal.is_set():
            if not self._is_ready():
                await self._signal.sleep(min(opts.idle_poll_seconds, self.readiness.interval_seconds))
                continue
            self._busy += 1
            try:
                report = await asyncio.wait_for(self.scheduler.tick(self._signal), timeout=opts.tick_deadline_seconds)
            except TimeoutError:
                self._counters.tick_timeouts += 1
                log.warning("tick exceeded its deadline", extra={"slot": index})
                continue
            except AdxError as exc:
                self._counters.tick_errors += 1
                log.warning("tick failed", extra={"slot": index, "error": str(exc)})
                await self._signal.sleep(opts.error_backoff_seconds)
                continue
            except Exception:  # a bug must not silently retire a slot: count it, back off, keep ticking
                self._counters.tick_errors += 1
                log.exception("tick raised unexpectedly", extra={"slot": index})
                await self._signal.sleep(opts.error_backoff_seconds)
                continue
            finally:
                self._busy -= 1
            self._counters.ticks[report.outcome.value] += 1
            if report.executed is not None:
                self._counters.executed[report.executed.value] += 1
            if report.outcome is TickOutcome.IDLE:
                await self._signal.sleep(opts.idle_poll_seconds)
            elif report.outcome is TickOutcome.EXECUTION_FAILED:
                await self._signal.sleep(min(opts.error_backoff_seconds, opts.idle_poll_seconds))
            elif report.outcome is TickOutcome.CANCELLED:
                return
            # EXECUTED and SCAN_LIMIT_REACHED: schedule the next bounded tick at once.

    # --- shutdown ----------------------------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """Stop admission: no new claims; running drivers yield at their next node boundary."""
        if self._state == "running":
            self._state = "draining"
        self._signal.set()

    async def shutdown(self) -> None:
        """Drain for up to ``drain_seconds``, then force-abort remaining ticks and node tasks and wait."""
        self.begin_shutdown()
        tasks = [t for t in self._slots if not t.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.options.drain_seconds)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("drain period over; aborted ticks", extra={"aborted": len(pending)})
                await asyncio.gather(*pending, return_exceptions=True)
        if self._checker is not None:
            self._checker.cancel()
            await asyncio.gather(self._checker, return_exceptions=True)
        if self._done is not None:
            await asyncio.shield(self._done)
        if self._liveness is not None:
            await self._liveness.close()
        for tenant_scheduler in self.binding.tenant_schedulers:
            if tenant_scheduler.loop.driver.environments is not None:
                await tenant_scheduler.loop.driver.environments.close()  # the ADX API client's connections
        self._state = "stopped"

    async def wait(self) -> None:
        """Wait until every slot has exited. Cancelling this wait leaves the worker's tasks untouched."""
        if self._done is None:
            raise ConflictError("worker was not started")
        await asyncio.shield(self._done)

    def health(self) -> AgentWorkerHealth:
        c = self._counters
        return AgentWorkerHealth(
            state=self._state,
            identity=self.scheduler.identity,
            binding=self.binding.kind,
            tenant_id=self.scheduler.tenant_id,
            ready=self._is_ready() if self._state in ("running", "draining") else False,
            slots=self.options.slots,
            busy_slots=self._busy,
            ticks=dict(c.ticks),
            executed=dict(c.executed),
            tick_timeouts=c.tick_timeouts,
            tick_errors=c.tick_errors,
            readiness_checks=c.readiness_checks,
            readiness_failures=c.readiness_failures,
            uptime_seconds=round(time.monotonic() - self._started, 3),
        )
