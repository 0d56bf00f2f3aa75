"""The warm pool's bookkeeping: which shapes are kept warm, the ready members of each, what a claim takes.

A *member* is a sandbox started ahead of any create (issue 16): its dir (``.warm-<hex>``), cgroup, writable
layer and veth named after its member ID (``_warm-<hex>``, never a sandbox ID: ``_`` is not in SANDBOX_ID_RE),
its ID range and /30, and a supervisor whose init is mounted, placed in its cgroup and network namespace, and
parked until a create claims it (``_supervisor._park``). A claim renames the dir, the cgroup and the layer to
the new sandbox's ID; the veth and its nftables chain keep the member's name (``SandboxRecord.native_name``).

Kept here: no process, no file; the daemon side is ``_warm_create``.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from adx.images import POOL_HOLDER_PREFIX
from adx.model import NetworkPolicy
from adx.sandboxd._models import Resources, WarmPoolInfo
from adx.sandboxd._registry import WARM_DIR_PREFIX

__all__ = ["WARM_ID_PREFIX", "WarmKey", "WarmMember", "WarmPool"]

#: Members' cgroups, layers and veths are named ``_warm-<hex>``: a restart removes every such leftover.
WARM_ID_PREFIX = POOL_HOLDER_PREFIX  # the image store tells members from sandboxes by it


@dataclass(frozen=True)
class WarmKey:
    """What a member was made for: a create matches when all of it is equal (everything else of a sandbox
    — ID, environment, argv, cwd, labels, log group, egress policy — is applied at the claim)."""

    image: str | None  # the name asked for (the record keeps it)
    image_layers: tuple[str, ...] | None  # None: the host-derived skeleton
    image_user: str | None
    cpu_millis: int
    memory_bytes: int
    pids_max: int
    disk_bytes: int
    network: str
    #: execd as PID 1 (its interpreter: whether PID 1 runs it in process, and execd's mounts and sockets depend
    #: on it); None: a plain init. Every other execd option is in PID 1's argv, which the claim brings.
    execd_python: str | None = None

    @classmethod
    def of(
        cls,
        image: str | None,
        layers: list[str] | None,
        user: str | None,
        res: Resources,
        network: str,
        execd_python: str | None = None,
    ) -> WarmKey:
        return cls(
            image,
            tuple(layers) if layers else None,
            user,
            res.cpu_millis,
            res.memory_bytes,
            res.pids_max,
            res.disk_bytes,
            network,
            execd_python,
        )

    @property
    def resources(self) -> Resources:
        return Resources(
            cpu_millis=self.cpu_millis,
            memory_bytes=self.memory_bytes,
            pids_max=self.pids_max,
            disk_bytes=self.disk_bytes,
        )


@dataclass
class WarmMember:
    member_id: str  # the cgroup's, layer's and veth's name until (and the veth's after) the claim
    key: WarmKey
    dir: Path
    lock_fd: int  # its lifecycle lock, held by sandboxd: the parked supervisor waits on it
    id_base: int | None
    net_index: int | None
    policy: NetworkPolicy | None  # the egress policy its chain holds (the defaults'); a claim replaces a different one
    #: pidfds of its supervisor and its init, once ready: a member one of them left is dead (never claimed).
    pidfds: tuple[int, ...] = ()


#: A create counts as demand for its shape this long: the shapes kept are those asked for within it.
DEMAND_WINDOW_SECONDS = 120.0
#: At most this many creates are remembered (the window's bound under a flood of creates).
DEMAND_MAX = 1024


@dataclass
class WarmPool:
    """Which shapes are kept, and how many members each, follow demand: the claimable creates of the last
    ``DEMAND_WINDOW_SECONDS``. The shapes asked for most are kept first (ties: the most recent), up to
    ``shapes``; the defaults' shape is kept too while there is room (from the start, before any demand). A
    kept shape gets ``size`` members when it is asked for at least half as often as the most wanted one, else
    one: a rarely used shape costs a single member, a busy one never waits for a rarer one's refill. Memory and
    disk bound all of it (``WarmSandboxes._fits``)."""

    size: int  # most members per kept shape; 0: off
    shapes: int  # most shapes kept
    members: dict[WarmKey, list[WarmMember]] = field(default_factory=dict)
    making: dict[str, WarmMember] = field(default_factory=dict)  # being started (IDs and /30 already taken)
    claiming: dict[str, WarmMember] = field(default_factory=dict)  # sandbox ID -> member, reserve to claim
    #: Found dead (``take``, ``cull``), no longer counted: to destroy. Their IDs and /30 stay taken until then.
    dead: list[WarmMember] = field(default_factory=list)
    claims: int = 0
    misses: int = 0  # claimable creates that found no member (cold)
    made: int = 0
    failed: int = 0
    dropped: int = 0
    pinned: WarmKey | None = None  # the defaults' shape (when it could be resolved)
    _demand: deque[tuple[float, WarmKey]] = field(default_factory=deque)  # (monotonic time, shape), oldest first

    @staticmethod
    def new_ids() -> tuple[str, str]:
        """(member ID, dir name)."""
        tag = secrets.token_hex(8)
        return f"{WARM_ID_PREFIX}{tag}", f"{WARM_DIR_PREFIX}{tag}"

    def _counts(self, now: float | None) -> dict[WarmKey, int]:
        """Creates per shape in the window, least recently asked for first (a dict keeps insertion order)."""
        horizon = (time.monotonic() if now is None else now) - DEMAND_WINDOW_SECONDS
        while self._demand and self._demand[0][0] < horizon:
            self._demand.popleft()
        counts: dict[WarmKey, int] = {}
        for _, key in self._demand:
            counts[key] = counts.pop(key, 0) + 1  # re-inserted: the order becomes the last request's
        return counts

    def targets(self, now: float | None = None) -> dict[WarmKey, int]:
        """Members wanted per kept shape, most wanted shape first."""
        if not self.size:
            return {}
        counts = self._counts(now)
        order = list(reversed(counts))  # most recent first: the sort below is stable
        keys = sorted(order, key=lambda k: counts[k], reverse=True)
        if self.pinned is not None and self.pinned not in counts:
            keys.append(self.pinned)
        top = max(counts.values(), default=0)
        return {k: self.size if not top or 2 * counts.get(k, 0) >= top else 1 for k in keys[: self.shapes]}

    def kept(self, now: float | None = None) -> list[WarmKey]:
        """The shapes to keep warm, most wanted first."""
        return list(self.targets(now))

    def take(
        self, key: WarmKey, now: float | None = None, alive: Callable[[WarmMember], bool] = lambda m: True
    ) -> WarmMember | None:
        """A ready member for ``key`` that ``alive`` passes (counted as demand for the shape), or None (a miss: the
        create is cold). A member found dead on the way goes to ``dead``, uncounted."""
        if not self.size:
            return None
        self._demand.append((time.monotonic() if now is None else now, key))
        if len(self._demand) > DEMAND_MAX:
            self._demand.popleft()
        ready = self.members.get(key)
        while ready:
            member = ready.pop()
            if alive(member):
                self.claims += 1
                return member
            self.dead.append(member)
        self.misses += 1
        return None

    def cull(self, alive: Callable[[WarmMember], bool]) -> int:
        """Move every ready member ``alive`` says is dead to ``dead``; how many."""
        found = 0
        for ready in self.members.values():
            for member in [m for m in ready if not alive(m)]:
                ready.remove(member)
                self.dead.append(member)
                found += 1
        return found

    def next_wanted(self, now: float | None = None) -> WarmKey | None:
        """The kept shape to make a member for next: the one furthest below its target (ties: the most wanted),
        so every kept shape gets its first member before any gets its second. None: all are full."""
        best, best_fill = None, 1.0
        for key, target in self.targets(now).items():
            have = len(self.members.get(key, [])) + sum(m.key == key for m in self.making.values())
            if have / target < best_fill:
                best, best_fill = key, have / target
        return best

    def surplus(self, now: float | None = None) -> list[WarmMember]:
        """Members of shapes no longer kept, and a kept shape's beyond its target, oldest first (removed from
        the pool: the caller destroys them)."""
        targets = self.targets(now)
        out = []
        for key in list(self.members):
            ready = self.members[key]
            extra = len(ready) - targets.get(key, 0)
            if extra > 0:
                out += ready[:extra]
                del ready[:extra]
            if not ready:
                del self.members[key]
        return out

    def all_members(self) -> list[WarmMember]:
        return [m for ready in self.members.values() for m in ready] + list(self.making.values())

    def used_id_bases(self) -> set[int]:
        every = [*self.all_members(), *self.claiming.values(), *self.dead]
        return {m.id_base for m in every if m.id_base is not None}

    def used_net_indexes(self) -> set[int]:
        every = [*self.all_members(), *self.claiming.values(), *self.dead]
        return {m.net_index for m in every if m.net_index is not None}

    def info(self) -> WarmPoolInfo:
        return WarmPoolInfo(
            size=self.size,
            ready=sum(len(v) for v in self.members.values()),
            starting=len(self.making),
            shapes=len(self.kept()),
            claims=self.claims,
            misses=self.misses,
            made=self.made,
            failed=self.failed,
            dropped=self.dropped,
        )
