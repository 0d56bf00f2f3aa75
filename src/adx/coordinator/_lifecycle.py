"""Pause, resume and expiry in the Coordinator: EnsureRunning (CRD-5), node loss of paused objects (CRD-6),
the background scan (CRD-3) with retention and lifetime deadlines, and delete/expiry races (CRD-8).

Every change goes through a Redis compare-and-set on the record's revision; a caller that loses a race
reads the authority again and decides anew, so a late result can never revive a retired Environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field

from adx._node_client import NodeClients
from adx.coordinator._cache import CoordinatorCache
from adx.coordinator._placement import Refusal, rank_nodes
from adx.coordinator._store import CoordinatorStore, NoCapacity
from adx.errors import AdxError, ConflictError, UnavailableError, UncertainOutcomeError
from adx.model import (
    OPERATION,
    RESUME_FAILED,
    EnvironmentRecord,
    EnvironmentState,
    IdleAction,
    NetworkPolicy,
    NodeRecord,
    ResumeIntent,
    new_id,
)
from adx.model._records import RecordChanges

log = logging.getLogger("adx.coordinator.lifecycle")
S = EnvironmentState

#: States that end by themselves: a resume caller waits for them instead of failing.
_TRANSIENT = frozenset({S.PENDING, S.STARTING, S.PAUSING, S.RESUMING})
#: How long a resume may stay with one node before the scan asks that node again (CRD-5 background retry).
STALLED_RESUME_SECONDS = 15.0
#: CRD-10: how long a resume's target node must have been without a session before its resume is taken back.
#: A node that lost its session only for a while (SIGSTOP, a Redis outage) may have resumed the Environment
#: locally (journaled, JRN-4): taking the resume back under it lost acknowledged writes in the fault soak
#: (fresh-ci, seed 3). Only a node gone far longer than any such pause is treated as lost.
RESUME_TARGET_LOST_SECONDS = 120.0


class ResumeTimeout(UnavailableError):
    code = "resume_timeout"


@dataclass(eq=False)
class LifecycleOps:
    """Pause, resume, lifetime and network changes of Environments, and the background scan that drives them."""

    store: CoordinatorStore
    cache: CoordinatorCache
    nodes: NodeClients | None
    _: KW_ONLY
    #: The Coordinator's delete (tenant, Environment ID): what an expired lifetime with action 'delete' runs.
    delete: Callable[[str, str], Awaitable[EnvironmentRecord]]
    resume_retry_seconds: float = 30.0
    _resume_locks: dict[str, asyncio.Lock] = field(default_factory=dict, init=False)
    #: env -> time before which a resume that every node refused is not driven again (capacity round)
    _refused_until: dict[str, float] = field(default_factory=dict, init=False)
    #: Environments whose refused resume the background capacity round asks again for (at _refused_until)
    _capacity_round: set[str] = field(default_factory=set, init=False)
    _busy: set[str] = field(default_factory=set, init=False)  # Environments with a scan action in flight
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    #: env -> when a stalled resume was last handed over again
    _nudged: dict[str, float] = field(default_factory=dict, init=False)

    def _alive(self, name: str | None, now: float) -> NodeRecord | None:
        node = self.cache.nodes.get(name or "")
        if node is None or node.session_expires_at < now:
            return None
        return node

    def _lost_for(self, name: str | None, now: float) -> float:
        """Seconds since ``name``'s session expired (0 while it is alive; unknown nodes count as long gone)."""
        node = self.cache.nodes.get(name or "")
        if node is None:
            return float("inf")
        return max(0.0, now - node.session_expires_at)

    # -- EnsureRunning (CRD-5) ------------------------------------------------------------------------
    async def ensure_running(self, tenant: str, env_id: str, within: float) -> EnvironmentRecord:
        """The one resume entry: returns the Running record, resuming a paused Environment first.

        Callers share one intent per Environment; a caller whose wait ends first gets ResumeTimeout while the
        resume goes on.
        """
        deadline = time.monotonic() + within
        handed_over = False
        while True:
            record = await self.store.get_tenant_environment(tenant, env_id)
            self.cache.apply(record)
            if record.state is S.RUNNING:
                return record
            if record.state is S.PAUSED:
                if handed_over and _failed_on_its_node(record):
                    # The node took the resume and it failed there: answer that, never hand it over again at once.
                    raise self._resume_failed(record)
                await self.drive_resume(record)
                handed_over = True
                continue
            if record.state not in _TRANSIENT:
                raise ConflictError(
                    f"environment {env_id} is {record.state.value}; only a paused Environment can be resumed",
                    details={"state": record.state.value},
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ResumeTimeout(
                    f"environment {env_id} is still {record.state.value} after {within:g}s; the resume goes on, "
                    "retry shortly",
                    details={"state": record.state.value},
                )
            await self.cache.wait_change(env_id, min(remaining, 1.0))

    async def drive_resume(self, record: EnvironmentRecord, *, capacity_round: bool = False) -> None:
        """Record a resume intent (CAS) on the best node and hand it over; serial per Environment.

        ``capacity_round``: the scan's one retry of a resume every node refused; a second refusal ends it."""
        lock = self._resume_locks.setdefault(record.id, asyncio.Lock())
        async with lock:
            current = await self.store.get_environment(record.id)
            self.cache.apply(current)
            if current.state is not S.PAUSED:
                return
            if time.monotonic() < self._refused_until.get(record.id, 0.0):
                if _failed_on_its_node(current):
                    raise self._resume_failed(current, hold=False)
                raise NoCapacity(
                    f"every node refused to resume {record.id} just now; the next capacity round is due shortly",
                    details={"retry_after_seconds": self.resume_retry_seconds},
                )
            operation = new_id(OPERATION)
            refused: list[Refusal] = []
            # CRD-10: demand on a lost Environment starts its recovery, which goes on until it runs somewhere.
            recovering = current.ownership_lost or current.recovery_pending
            for node, generation in self._resume_candidates(current, refused):
                intent = ResumeIntent(operation_id=operation, started_at=time.time(), refused=[r.node for r in refused])
                try:
                    resuming = await self.store.record_resume_intent(
                        current,
                        {
                            "resume_intent": intent,
                            "last_error": None,
                            "expires_at": self._renewed_deadline(current),
                            "recovery_pending": recovering,
                        },
                        node=node.name,
                        generation=generation,
                    )
                except NoCapacity as exc:
                    refused.append(Refusal(node.name, exc.message))
                    continue
                except ConflictError:
                    return  # someone committed meanwhile: the caller reads the authority again
                self.cache.apply(resuming)
                log.info(
                    "resume intent recorded",
                    extra={
                        "env_id": current.id,
                        "node": node.name,
                        "generation": generation,
                        "operation_id": operation,
                    },
                )
                if await self._hand_over(resuming, node, refused):
                    return
                current = await self.store.get_environment(record.id)
                self.cache.apply(current)
                if current.state is not S.PAUSED:
                    return
            # CRD-5: every node refused: one capacity round excludes them; resources are asked again later.
            self._refused_until[record.id] = time.monotonic() + self.resume_retry_seconds
            if not capacity_round:
                self._capacity_round.add(record.id)
            reasons = "; ".join(f"{r.node}: {r.reason}" for r in refused) or "no node can take it"
            raise NoCapacity(
                f"no node can resume {record.id} now ({reasons}); retry after {self.resume_retry_seconds:g}s",
                details={"refusals": reasons, "retry_after_seconds": self.resume_retry_seconds},
            )

    def _resume_failed(self, record: EnvironmentRecord, *, hold: bool = True) -> UnavailableError:
        """CRD-5: a resume its node accepted and then failed (the Environment is paused again, nothing runs). Like
        a refusal by every node, it holds the Environment for one capacity round: demand meanwhile gets this
        answer at once instead of a tight loop of hand-overs that fail the same way."""
        if hold:
            self._refused_until[record.id] = time.monotonic() + self.resume_retry_seconds
        return UnavailableError(
            f"environment {record.id} could not be resumed on node {record.node}: {record.last_error}; it stays "
            f"paused and is tried again on demand after {self.resume_retry_seconds:g}s",
            details={"state": record.state.value, "retry_after_seconds": self.resume_retry_seconds},
        )

    @staticmethod
    def _renewed_deadline(record: EnvironmentRecord) -> float | None:
        """A resumed Environment whose lifetime ended (or was consumed by its lifetime pause) gets a new one."""
        lifetime = record.spec.lifecycle.lifetime_seconds
        now = time.time()
        if lifetime is not None and (record.expires_at is None or record.expires_at <= now):
            return now + lifetime
        return record.expires_at

    def _resume_candidates(self, record: EnvironmentRecord, refused: list[Refusal]) -> list[tuple[NodeRecord, int]]:
        """The original node first; another compatible node only when the checkpoint is shared and the
        original refused (explicit NoCapacity, tried first) or is gone (CRD-5, CRD-6)."""
        checkpoint = record.checkpoint
        if checkpoint is None:
            raise ConflictError(f"environment {record.id} is paused without a checkpoint; it cannot be resumed")
        now = time.time()
        original = self._alive(checkpoint.node, now)
        candidates: list[tuple[NodeRecord, int]] = []
        same_owner = record.node == checkpoint.node
        if original is not None:
            candidates.append((original, record.generation if same_owner else record.generation + 1))
        elif checkpoint.storage == "local":
            raise UnavailableError(
                f"environment {record.id} is paused on node {checkpoint.node}'s local storage and that node is not "
                "available; it can resume when the node returns",
                details={"node": checkpoint.node},
            )
        if checkpoint.storage == "shared":
            others = [n for n in self.cache.nodes.values() if n.name != checkpoint.node and n.shared_storage]
            ranked, cannot = rank_nodes(others, record.spec.resources, now, needs_checkpoint=True)
            refused.extend(cannot)
            candidates.extend((node, record.generation + 1) for node in ranked)
        return candidates

    async def _hand_over(self, resuming: EnvironmentRecord, node: NodeRecord, refused: list[Refusal]) -> bool:
        """True when the node took the resume (or may have: a lost reply keeps the ownership, CRD-5)."""
        if self.nodes is None:
            return True
        try:
            await self.nodes.resume(node.address, resuming)
            return True
        except (UnavailableError, UncertainOutcomeError) as exc:
            # CRD-5: a timeout or lost reply keeps the current ownership (never a second execution); the node
            # finds the intent in its catalog, and the scan asks again if it stalls.
            log.warning("node %s did not confirm the resume of %s: %s", node.name, resuming.id, exc)
            return True
        except AdxError as exc:
            refused.append(Refusal(node.name, str(exc)))
        # An explicit refusal: back to paused (releasing what the intent reserved), then the next candidate.
        with contextlib.suppress(ConflictError):
            back = await self.store.commit_environment(
                resuming,
                {"state": S.PAUSED, "resume_intent": None, "last_error": f"node {node.name} refused the resume"},
                release_reservation=True,
            )
            self.cache.apply(back)
        return False

    # -- pause and lifetime -------------------------------------------------------------------------
    async def pause(self, tenant: str, env_id: str) -> EnvironmentRecord:
        record = await self.store.get_tenant_environment(tenant, env_id)
        return await self._pause(record)

    async def _pause(self, record: EnvironmentRecord) -> EnvironmentRecord:
        if record.state is S.PAUSED:
            raise ConflictError(f"environment {record.id} is already paused", details={"state": "paused"})
        if record.state is not S.RUNNING:
            raise ConflictError(
                f"environment {record.id} is {record.state.value}; only a running Environment can be paused",
                details={"state": record.state.value},
            )
        node = self._alive(record.node, time.time())
        if node is None or self.nodes is None:
            raise UnavailableError(f"environment {record.id}: its node {record.node} is not available now")
        if not node.checkpoint_capable:
            raise ConflictError(f"node {node.name} cannot checkpoint; environment {record.id} cannot be paused")
        wait = record.spec.lifecycle.effective_pause_options.wait_seconds
        paused = await self.nodes.pause(node.address, record, wait_seconds=wait)
        self.cache.apply(paused)
        return paused

    async def set_lifetime(self, tenant: str, env_id: str, seconds: float, action: str) -> EnvironmentRecord:
        def changes(record: EnvironmentRecord) -> RecordChanges:
            update: RecordChanges = {"expires_at": time.time() + seconds}
            if action:
                lifecycle = record.spec.lifecycle.model_copy(update={"lifetime_action": IdleAction(action)})
                update["spec"] = record.spec.model_copy(update={"lifecycle": lifecycle})
            return update

        return await self._change_live(tenant, env_id, changes)

    async def set_network(self, tenant: str, env_id: str, network: NetworkPolicy) -> EnvironmentRecord:
        """Store a new network policy as a spec revision (NOD-10); the owning node applies it in place when it
        runs, a paused one gets it when it resumes."""

        def changes(record: EnvironmentRecord) -> RecordChanges:
            return {
                "spec": record.spec.model_copy(update={"network": network}),
                "network_revision": record.revision + 1,  # the revision this commit makes
            }

        return await self._change_live(tenant, env_id, changes)

    async def _change_live(
        self, tenant: str, env_id: str, changes: Callable[[EnvironmentRecord], RecordChanges]
    ) -> EnvironmentRecord:
        """Commit ``changes(record)`` on the tenant's Environment unless it is being deleted, read again and
        retried (up to five times) while others commit in between."""
        for _ in range(5):
            record = await self.store.get_tenant_environment(tenant, env_id)
            if record.state in (S.DELETING, S.DELETED):
                raise ConflictError(f"environment {env_id} is {record.state.value}", details={"state": "deleting"})
            try:
                committed = await self.store.commit_environment(record, changes(record), check_generation=False)
            except ConflictError:
                continue
            self.cache.apply(committed)
            return committed
        raise ConflictError(f"environment {env_id} keeps changing; try again")

    # -- the background scan (CRD-3) -----------------------------------------------------------------
    async def scan_once(self) -> None:
        now = time.time()
        self.cache.retired_checkpoints = await self.store.retired_checkpoints()
        for record in list(self.cache.environments.values()):
            if record.id in self._busy:
                continue
            action = self._due(record, now)
            if action is not None:
                self._busy.add(record.id)
                task = asyncio.create_task(self._act(record, action), name=f"scan-{action}-{record.id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _due(self, record: EnvironmentRecord, now: float) -> str | None:
        lifetime_over = record.expires_at is not None and record.expires_at <= now
        if record.state is not S.PAUSED:
            self._capacity_round.discard(record.id)
            self._refused_until.pop(record.id, None)
        if record.state is S.PAUSED:
            checkpoint = record.checkpoint
            if checkpoint is not None and checkpoint.expires_at is not None and checkpoint.expires_at <= now:
                return "retention-expired"  # ENV-3: TTL from publication
            if lifetime_over and record.spec.lifecycle.lifetime_action is IdleAction.DELETE:
                return "lifetime-delete"
            if not record.ownership_lost and checkpoint is not None and self._alive(checkpoint.node, now) is None:
                return "ownership-lost"
            if record.recovery_pending and self._refused_until.get(record.id, 0.0) <= time.monotonic():
                return "recovery-continue"  # CRD-10: not dormancy: no demand is waited for
            if record.id in self._capacity_round and self._refused_until.get(record.id, 0.0) <= time.monotonic():
                return "capacity-round"
            return None
        if record.state is S.RUNNING and lifetime_over:
            return "lifetime-" + record.spec.lifecycle.lifetime_action.value
        if record.state is S.RESUMING and record.resume_intent is not None:
            if self._lost_for(record.node, now) > RESUME_TARGET_LOST_SECONDS:
                return "resume-target-lost"
            last = max(record.resume_intent.started_at, self._nudged.get(record.id, 0.0))
            if now - last > STALLED_RESUME_SECONDS:
                self._nudged[record.id] = now
                return "resume-stalled"
        return None

    async def _act(self, record: EnvironmentRecord, action: str) -> None:
        try:
            await self._act_once(record, action)
        finally:
            self._busy.discard(record.id)

    async def _act_once(self, record: EnvironmentRecord, action: str) -> None:
        try:
            if action in ("retention-expired", "lifetime-delete") and record.state is S.PAUSED:
                # Nothing runs anywhere: the Coordinator retires it itself (its checkpoint is retired with it);
                # a resume that won the race changed the revision and this CAS fails (CRD-8).
                deleted = await self.store.commit_environment(
                    record, {"state": S.DELETED, "last_error": action.replace("-", " ")}, check_generation=False
                )
                self.cache.apply(deleted)
                log.info("paused environment retired: %s", action, extra={"env_id": record.id})
            elif action == "lifetime-delete":
                await self.delete(record.tenant, record.id)
            elif action == "lifetime-pause":
                paused = await self._pause(record)
                # The deadline is consumed: a resume starts a new lifetime (else it would pause again at once).
                consumed = await self.store.commit_environment(paused, {"expires_at": None}, check_generation=False)
                self.cache.apply(consumed)
            elif action == "ownership-lost":
                # CRD-6: it stays paused; the first demand resumes it elsewhere (shared checkpoint).
                lost = await self.store.commit_environment(record, {"ownership_lost": True}, check_generation=False)
                self.cache.apply(lost)
                log.info("paused environment lost its node", extra={"env_id": record.id, "node": record.node})
            elif action == "capacity-round":
                # CRD-5: every node refused this resume; resources are asked for once more, on every candidate.
                self._capacity_round.discard(record.id)
                self._refused_until.pop(record.id, None)
                await self.drive_resume(record, capacity_round=True)
            elif action == "resume-target-lost":
                # CRD-10: the node taking the resume over is gone before it ran the Environment: back to Paused
                # (its reservation released; a late result of that node fails on the revision), and the
                # recovery goes on from there on another node, with no new demand needed.
                back = await self.store.commit_environment(
                    record,
                    {
                        "state": S.PAUSED,
                        "resume_intent": None,
                        "recovery_pending": True,
                        "last_error": f"node {record.node} was lost while resuming it; recovery goes on",
                    },
                    check_generation=False,
                    release_reservation=True,
                )
                self.cache.apply(back)
                log.warning(
                    "resume target lost; the recovery goes on", extra={"env_id": record.id, "node": record.node}
                )
            elif action == "recovery-continue":
                await self.drive_resume(record)
            elif action == "resume-stalled":
                node = self._alive(record.node, time.time())
                if node is not None and self.nodes is not None:
                    await self.nodes.resume(node.address, record)
        except AdxError as exc:
            log.warning("scan action %s on %s: %s", action, record.id, exc, extra={"env_id": record.id})
            with contextlib.suppress(AdxError):
                self.cache.apply(await self.store.get_environment(record.id))

    async def run_scans(self, interval: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.scan_once()
            except AdxError as exc:
                log.warning("scan skipped: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


def _failed_on_its_node(record: EnvironmentRecord) -> bool:
    """Paused again by its node after a resume the node had taken (no new execution exists)."""
    return record.last_error is not None and record.last_error.startswith(RESUME_FAILED)
