"""AGT-12: a fair scheduler over tenant schedulers, with replica-global smooth weighted round robin.

Every tick first *reserves* the next pick of the policy's one sequence, shared by all workers (replicas) of the
policy: in one transaction, under the policy row's lock, each tenant's ``current`` grows by its weight, the
tenant with the largest ``current`` (ties: tenant order) is picked and loses the total weight, and the pick is
recorded with its sequence number. So the global order is exactly the smooth weighted round robin sequence
whatever the number of workers, and it continues across crashes (a pick is committed or it never happened).

Starvation bound (exact, in reservations): with total weight ``W`` the sequence is periodic with period ``W``
and every period holds exactly ``w_i`` picks of tenant ``i``; the largest number of reservations between two
consecutive picks of a tenant is :func:`starvation_bound` (computed from the sequence, e.g. 6, 3, 3 for weights
1, 2, 3). A reservation whose tenant has nothing runnable is consumed and the tick takes the next one (at most
one per tenant per tick), so fairness never leaves capacity idle. After a round in which every tenant was
idle the worker reserves nothing for ``idle_backoff_seconds``.

Each tenant scheduler keeps its own store: its queue visibility and database credentials stay tenant-scoped;
the fair store only reads and writes the three fairness tables.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from adx.agents._driver import ShutdownSignal
from adx.agents._scheduler import DurableTenantScheduler, TickOutcome, TickReport, _new_identity
from adx.agents._store import AgentStore
from adx.errors import ConflictError, InvalidInputError

__all__ = ["DurableFairScheduler", "FairnessPolicy", "smooth_weighted_sequence", "starvation_bound"]

_POLICY = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


@dataclass(frozen=True, slots=True)
class FairnessPolicy:
    name: str
    weights: Mapping[str, int]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _POLICY.match(self.name):
            raise InvalidInputError("policy", "must be 1-63 characters of a-z, 0-9, '_' or '-'")
        if not 1 <= len(self.weights) <= 128:
            raise InvalidInputError("weights", "needs 1 to 128 tenants")
        for tenant, weight in self.weights.items():
            if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 1_000_000:
                raise InvalidInputError(f"weights.{tenant}", "must be an integer between 1 and 1000000")

    @property
    def tenants(self) -> list[str]:
        return sorted(self.weights)

    def to_json(self) -> dict[str, int]:
        return {t: int(self.weights[t]) for t in self.tenants}

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


def smooth_weighted_sequence(weights: Mapping[str, int], count: int) -> list[str]:
    """The reference SWRR sequence (nginx's algorithm), ties broken by tenant order."""
    tenants = sorted(weights)
    total = sum(weights.values())
    current = dict.fromkeys(tenants, 0)
    out = []
    for _ in range(count):
        for t in tenants:
            current[t] += weights[t]
        chosen = max(tenants, key=lambda t: (current[t], -tenants.index(t)))
        current[chosen] -= total
        out.append(chosen)
    return out


def starvation_bound(weights: Mapping[str, int]) -> dict[str, int]:
    """The exact largest number of reservations between two consecutive picks of each tenant (the sequence is
    periodic with period W, so two periods show every gap)."""
    total = sum(weights.values())
    seq = smooth_weighted_sequence(weights, 3 * total)
    bound = {}
    for tenant in weights:
        positions = [i for i, t in enumerate(seq) if t == tenant]
        bound[tenant] = max(b - a for a, b in itertools.pairwise(positions))
    return bound


class DurableFairScheduler:
    """Wraps one tenant scheduler per tenant of ``policy``; use with ``AgentWorkerBinding.fair``."""

    #: picks kept in adx_agent_fair_picks per policy (older ones are deleted by later picks)
    keep_picks = 10_000

    def __init__(
        self,
        store: AgentStore,
        tenant_schedulers: Sequence[DurableTenantScheduler],
        policy: FairnessPolicy,
        *,
        idle_backoff_seconds: float = 0.5,
    ) -> None:
        if not idle_backoff_seconds >= 0:
            raise InvalidInputError("idle_backoff_seconds", "must not be negative")
        self.idle_backoff_seconds = idle_backoff_seconds
        self._idle_until = 0.0
        by_tenant = {s.tenant_id: s for s in tenant_schedulers}
        if len(by_tenant) != len(tenant_schedulers):
            raise InvalidInputError("tenant_schedulers", "one scheduler per tenant")
        if set(by_tenant) != set(policy.weights):
            raise InvalidInputError(
                "tenant_schedulers", f"tenants {sorted(by_tenant)} differ from the policy's {policy.tenants}"
            )
        self.store = store
        self.policy = policy
        self.tenant_schedulers = [by_tenant[t] for t in policy.tenants]
        self._by_tenant = by_tenant
        # One identity for the whole binding: one liveness registration covers every lease it takes.
        self.identity = _new_identity()
        for s in self.tenant_schedulers:
            s.identity = self.identity
        self._worker_owned = False

    @property
    def tenant_id(self) -> str:
        return f"fair:{self.policy.name}"

    async def verify_policy(self) -> None:
        """Persist the policy on first use; refuse a different one (AGT-13: checked at worker start)."""
        p = self.policy
        async with self.store.transaction("verify fairness policy") as conn:
            await conn.execute(
                "INSERT INTO adx_agent_fair_policies (policy, weights, digest) VALUES (%s, %s, %s)"
                " ON CONFLICT (policy) DO NOTHING",
                (p.name, json.dumps(p.to_json()), p.digest),
            )
            cur = await conn.execute(
                "SELECT weights, digest FROM adx_agent_fair_policies WHERE policy = %s FOR UPDATE", (p.name,)
            )
            row = await cur.fetchone()
            assert row is not None
            if row["digest"] != p.digest:
                raise ConflictError(
                    f"fairness policy {p.name!r} is persisted with weights {row['weights']}, not {p.to_json()}:"
                    " a worker must not start against a different policy"
                )
            for tenant in p.tenants:
                await conn.execute(
                    "INSERT INTO adx_agent_fair_state (policy, tenant_id, weight) VALUES (%s, %s, %s)"
                    " ON CONFLICT DO NOTHING",
                    (p.name, tenant, p.weights[tenant]),
                )

    async def reserve(self) -> tuple[int, str]:
        """Take the next pick of the policy's global sequence (one transaction). Returns (seq, tenant)."""
        p = self.policy
        async with self.store.transaction("fair pick") as conn:
            cur = await conn.execute(
                "UPDATE adx_agent_fair_policies SET seq = seq + 1 WHERE policy = %s RETURNING seq", (p.name,)
            )
            row = await cur.fetchone()
            if row is None:
                raise ConflictError(f"fairness policy {p.name!r} is not persisted")
            seq = int(row["seq"])
            cur = await conn.execute(
                "UPDATE adx_agent_fair_state SET current = current + weight WHERE policy = %s"
                " RETURNING tenant_id, current",
                (p.name,),
            )
            currents = {r["tenant_id"]: int(r["current"]) for r in await cur.fetchall()}
            tenants = p.tenants
            chosen = max(tenants, key=lambda t: (currents[t], -tenants.index(t)))
            total = sum(p.weights.values())
            await conn.execute(
                "UPDATE adx_agent_fair_state SET current = current - %s WHERE policy = %s AND tenant_id = %s",
                (total, p.name, chosen),
            )
            await conn.execute(
                "INSERT INTO adx_agent_fair_picks (policy, seq, tenant_id, picked_by) VALUES (%s, %s, %s, %s)",
                (p.name, seq, chosen, self.identity),
            )
            if seq % 1000 == 0:
                await conn.execute(
                    "DELETE FROM adx_agent_fair_picks WHERE policy = %s AND seq <= %s", (p.name, seq - self.keep_picks)
                )
        return seq, chosen

    async def tick(self, shutdown: ShutdownSignal | None = None) -> TickReport:
        """Reserve picks until one tenant executes something (at most one reservation per tenant)."""
        signal = shutdown or ShutdownSignal()
        if time.monotonic() < self._idle_until:
            # Every tenant was idle a moment ago: reserve nothing (an idle worker must not burn the sequence
            # and the database); every slot of this worker shares the pause.
            return TickReport(TickOutcome.IDLE)
        last: TickReport | None = None
        for _ in range(len(self.tenant_schedulers)):
            if signal.is_set():
                return TickReport(TickOutcome.CANCELLED)
            _, tenant = await self.reserve()
            report = await self._by_tenant[tenant].tick(signal)
            if report.outcome is not TickOutcome.IDLE:
                return report
            last = report
        self._idle_until = time.monotonic() + self.idle_backoff_seconds
        return last or TickReport(TickOutcome.IDLE)
