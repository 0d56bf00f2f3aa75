"""AGT-15 maintenance: deadline cancellation, child-run cancellation propagation and settlement, join
publication and failure convergence. Never model or tool work.

One bounded loop over 1-128 distinct tenants. Each tick walks, per tenant and task, one keyset page of the
task's order from the tenant's persisted cursor for that task, acts on every item, and commits the cursor past
the page. An item whose action fails is counted and skipped: it never blocks the rest of its page. A page
shorter than the page size ends a pass: the cursor goes back to the start, so skipped items are revisited by the
next pass (and a restarted maintenance process resumes from the persisted cursor). Ticks run only while
readiness evidence is fresh (AGT-19); a tick past its limit is abandoned and the loop stops (AGT-15: discovery
errors and tick timeouts stop and drain).

Tasks, each acting through one transaction per item (several replicas rely on those being idempotent):

- ``deadline_cancellation``: a live run whose ``deadline_at`` passed (database time) gets a cancellation
  request; a worker confirms it like any other (AGT-8).
- ``child_cancellation``: a live child of a parent that was asked to cancel, or that ended failed or cancelled,
  gets a cancellation request (propagation; a worker confirms it).
- ``child_settlement``: a finished parent whose children are all finished is marked settled
  (``children_settled``): a cancelled parent's tree is then cancelled and confirmed.
- ``join_publication``: a waiting run's join whose children are all finished is resolved with their outcomes;
  the run wakes.
- ``failure_convergence``: under a ``fail_fast`` join, a failed or cancelled child gets its live siblings
  cancelled, so the join converges (and is then published).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from adx.agents._config import AgentMaintenanceConfig
from adx.agents._driver import ShutdownSignal
from adx.agents._maintenance_schemas import bind_audit_schemas, maintenance_audit_schemas
from adx.agents._maintenance_tasks import MaintenanceTask, act, discover
from adx.agents._options import options_from, require_between, require_positive
from adx.agents._pg import check_tenant
from adx.agents._schemas import JsonSchemaRegistry
from adx.agents._signals import stop_on_signals
from adx.agents._store import AgentStore
from adx.agents._worker import AgentWorkerReadiness
from adx.errors import AdxError, InvalidInputError, UnavailableError

__all__ = ["AgentMaintenance", "AgentMaintenanceHealth", "AgentMaintenanceOptions", "run_maintenance"]

log = logging.getLogger("adx.agents.maintenance")


@dataclass(frozen=True, slots=True)
class AgentMaintenanceOptions:
    interval_seconds: float = 0.25
    error_interval_seconds: float = 1.0
    tick_limit_seconds: float = 30.0
    page_size: int = 100

    def __post_init__(self) -> None:
        require_positive(self, "interval_seconds", "error_interval_seconds", "tick_limit_seconds")
        require_between(self, 1, 10_000, "page_size")


@dataclass(frozen=True, slots=True)
class AgentMaintenanceHealth:
    """Redacted counters only: no run IDs, no request content."""

    state: str
    tenants: int
    ticks: int
    deadline_cancellations: int
    child_cancellations: int
    failure_convergences: int
    joins_published: int
    children_settled: int
    item_errors: int
    passes: int
    ready: bool


@dataclass
class _Counters:
    ticks: int = 0
    item_errors: int = 0
    passes: int = 0
    acted: dict[MaintenanceTask, int] = field(default_factory=lambda: dict.fromkeys(MaintenanceTask, 0))


class AgentMaintenance:
    """The binding (AGT-15): 1-128 distinct tenants, the store, the four frozen audit schemas (``schemas``, by
    default exactly the runtime's; a registry lacking one or holding a different body is refused here, before
    any work) and a mandatory readiness check."""

    def __init__(
        self,
        store: AgentStore,
        tenants: list[str],
        readiness: AgentWorkerReadiness,
        options: AgentMaintenanceOptions | None = None,
        *,
        schemas: JsonSchemaRegistry | None = None,
    ) -> None:
        if not 1 <= len(tenants) <= 128:
            raise InvalidInputError("tenants", "needs 1 to 128 tenants")
        if len(set(tenants)) != len(tenants):
            raise InvalidInputError("tenants", "must be distinct")
        for tenant in tenants:
            check_tenant(tenant)
        if not isinstance(readiness, AgentWorkerReadiness):
            raise InvalidInputError("readiness", "an AgentWorkerReadiness is mandatory")
        self.audit_schemas = bind_audit_schemas(maintenance_audit_schemas() if schemas is None else schemas)
        self.store = store
        self.tenants = list(tenants)
        self.readiness = readiness
        self.options = options or AgentMaintenanceOptions()
        self._counters = _Counters()
        self._ready_until = 0.0
        self._state = "created"
        self._signal = ShutdownSignal()

    async def _cursor(self, tenant: str, task: MaintenanceTask) -> tuple[datetime, uuid.UUID] | None:
        async with self.store.connection("maintenance: cursor") as conn:
            cur = await conn.execute(
                "SELECT after_at, after_id FROM adx_agent_maintenance_cursors WHERE tenant_id = %s AND task = %s",
                (tenant, task.value),
            )
            row = await cur.fetchone()
        if row is None or row["after_at"] is None or row["after_id"] is None:
            return None
        return row["after_at"], row["after_id"]

    async def _save_cursor(
        self, tenant: str, task: MaintenanceTask, after: tuple[datetime, uuid.UUID] | None, exhausted: bool
    ) -> None:
        async with self.store.transaction("maintenance: cursor", single_statement=True) as conn:
            await conn.execute(
                "INSERT INTO adx_agent_maintenance_cursors (tenant_id, task, after_at, after_id, passes)"
                " VALUES (%(t)s, %(task)s, %(at)s, %(id)s, %(p)s) ON CONFLICT (tenant_id, task) DO UPDATE SET"
                " after_at = EXCLUDED.after_at, after_id = EXCLUDED.after_id,"
                " passes = adx_agent_maintenance_cursors.passes + EXCLUDED.passes, updated_at = now()",
                {
                    "t": tenant,
                    "task": task.value,
                    "at": None if exhausted or after is None else after[0],
                    "id": None if exhausted or after is None else after[1],
                    "p": 1 if exhausted else 0,
                },
            )

    async def _run_task(self, tenant: str, task: MaintenanceTask) -> int:
        """One page of one task for one tenant, from its cursor; the cursor then moves past the page (or back
        to the start when the page ended the pass). Returns the page's item errors."""
        after = await self._cursor(tenant, task)
        items = await discover(self.store, task, tenant, after, self.options.page_size)
        exhausted = len(items) < self.options.page_size
        errors = 0
        for item in items:
            try:
                self._counters.acted[task] += await act(self.store, task, tenant, item)
            except AdxError as exc:  # one failing item never blocks the rest of its page
                errors += 1
                self._counters.item_errors += 1
                log.warning("maintenance item failed", extra={"task": task.value, "error": type(exc).__name__})
        if exhausted:
            self._counters.passes += 1
        await self._save_cursor(tenant, task, (items[-1].at, items[-1].run_id) if items else after, exhausted)
        return errors

    async def tick(self) -> int:
        """One bounded step of every task over every tenant; returns the number of item errors."""
        self._counters.ticks += 1
        errors = 0
        for tenant in self.tenants:
            for task in MaintenanceTask:
                errors += await self._run_task(tenant, task)
        return errors

    async def _ready(self) -> bool:
        if time.monotonic() < self._ready_until:
            return True
        if not await self.readiness.probe(log):
            self._ready_until = 0.0
            return False
        self._ready_until = time.monotonic() + self.readiness.ttl_seconds
        return True

    async def run(self) -> None:
        """Tick until :meth:`stop`; a tick past its limit or a discovery error stops the loop."""
        self._state = "running"
        opts = self.options
        try:
            while not self._signal.is_set():
                if not await self._ready():  # AGT-19: expired readiness pauses new work
                    await self._signal.sleep(opts.error_interval_seconds)
                    continue
                try:
                    errors = await asyncio.wait_for(self.tick(), timeout=opts.tick_limit_seconds)
                except TimeoutError:
                    raise UnavailableError(f"maintenance tick exceeded {opts.tick_limit_seconds}s") from None
                await self._signal.sleep(opts.error_interval_seconds if errors else opts.interval_seconds)
        finally:
            self._state = "stopped"

    def stop(self) -> None:
        """Initiate the stop; the running tick finishes (never closes the store: it may be shared, AGT-19)."""
        self._signal.set()

    def health(self) -> AgentMaintenanceHealth:
        c = self._counters
        return AgentMaintenanceHealth(
            state=self._state,
            tenants=len(self.tenants),
            ticks=c.ticks,
            deadline_cancellations=c.acted[MaintenanceTask.DEADLINES],
            child_cancellations=c.acted[MaintenanceTask.CHILD_CANCELLATION],
            failure_convergences=c.acted[MaintenanceTask.FAILURE_CONVERGENCE],
            joins_published=c.acted[MaintenanceTask.JOIN_PUBLICATION],
            children_settled=c.acted[MaintenanceTask.CHILD_SETTLEMENT],
            item_errors=c.item_errors,
            passes=c.passes,
            ready=time.monotonic() < self._ready_until,
        )


async def run_maintenance(cfg: AgentMaintenanceConfig) -> AgentMaintenanceHealth:
    """``adx agent maintenance``: run until SIGTERM/SIGINT, then let the running tick finish (drain)."""
    store = await AgentStore.open(cfg.database_url, max_size=2, migrate=False)
    try:
        maintenance = AgentMaintenance(
            store,
            cfg.tenants,
            AgentWorkerReadiness.database(store),
            options_from(AgentMaintenanceOptions, cfg),
        )
        with stop_on_signals(maintenance.stop):
            task = asyncio.create_task(maintenance.run())
            log.info("agent maintenance started", extra={"tenants": len(cfg.tenants)})
            stopper = asyncio.create_task(maintenance._signal.wait())
            try:
                await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done():  # stopping: the running tick may finish within the drain period
                    done, _ = await asyncio.wait({task}, timeout=cfg.drain_seconds)
                    if not done:
                        task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task  # a discovery error or tick timeout surfaces here
            finally:
                stopper.cancel()
        return maintenance.health()
    finally:
        await store.close()
