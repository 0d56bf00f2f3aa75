"""The sandbox record table and the daemon's shared state: records, tombstones, reservations, per-sandbox
locks, and the validated, persist-then-publish state transitions (the registry on disk is the commit point)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from pathlib import Path
from typing import Any

from adx.errors import ConflictError, NotFoundError
from adx.images import ImageStore
from adx.sandboxd._cgroups import CgroupLayout, SandboxCgroup
from adx.sandboxd._config import SandboxdConfig
from adx.sandboxd._control_hub import ControlHub
from adx.sandboxd._errors import PermissionDeniedError
from adx.sandboxd._image import ImageMeta
from adx.sandboxd._layers import BaseImageBuilder
from adx.sandboxd._logs import LogStore
from adx.sandboxd._models import ResourceInfo, Resources, SandboxRecord, SandboxRef
from adx.sandboxd._netpolicy import NetFilter
from adx.sandboxd._registry import Registry, Tombstone
from adx.sandboxd._sandbox_dirs import SpareDirs
from adx.sandboxd._sandbox_layout import EXIT_FILE, boot_id
from adx.sandboxd._spawn_client import SpawnerProcess
from adx.sandboxd._states import State, check_transition
from adx.sandboxd._storage import StoragePool
from adx.sandboxd._veth import VethPool
from adx.sandboxd._wait_watch import RecordTable, WaitWatch
from adx.sandboxd._warm_pool import WarmPool

__all__ = ["SandboxTable"]

log = logging.getLogger("adx.sandboxd")


class SandboxTable:
    """What every part of sandboxd works on: the records (persisted, then published here), the tombstoned IDs
    and pending reclaims (which keep their reservation), the request-ID index, the per-sandbox locks."""

    def __init__(self, config: SandboxdConfig, layout: CgroupLayout) -> None:
        self.config = config
        self.layout = layout
        self.registry = Registry(config.state_dir, config.max_record_bytes)
        self.spawner = SpawnerProcess()
        self.wait_watch = WaitWatch(EXIT_FILE)  # wakes Wait calls (_observe) instead of a poll per sandbox
        self.records: dict[str, SandboxRecord] = RecordTable(self.wait_watch.poke)
        self.tombstoned: set[str] = set()
        self.pending_reclaim: dict[str, Tombstone] = {}
        self.by_request: dict[str, str] = {}
        self.deferred_errors: list[str] = []
        self.started_at = time.time()
        self.boot_id = boot_id()
        self._locks: dict[str, asyncio.Lock] = {}
        self._alloc_lock: asyncio.Lock | None = None
        self._image: ImageMeta | None = None  # the host-derived skeleton, loaded at start (preflight)
        self._image_root = Path()
        # Named images and their layers (``adx image``); the host-derived skeleton above stays the fallback.
        self.images = ImageStore(config.images_root / "store")
        self.base_builder = BaseImageBuilder(self.images) if config.base_image == "debian" else None
        self._pool: StoragePool | None = None  # disk_quota = 'btrfs' (or 'auto' that found one)
        self._userns = False  # sandboxes get a user namespace each (decided at start: config and host)
        self._userns_note: str | None = None
        self._disk_quota_note: str | None = None  # why disk requests are not enforced (None: they are)
        self.veth_pool = VethPool(config.veth_pool)
        self.netfilter = NetFilter(config.state_dir, config.veth_pool)
        self.logs = LogStore(config.state_dir / "logs")  # workload output, per group (_output, _logs)
        self._resource: ResourceInfo | None = None
        self._resource_error: str | None = None
        self.hub: ControlHub | None = None
        self.spares = SpareDirs(self.registry)
        self.warm = WarmPool(config.warm_pool, config.warm_pool_shapes)  # pre-warmed sandboxes (_warm_create)
        self.capacity = Resources(cpu_millis=0, memory_bytes=0, pids_max=0, disk_bytes=0)

    @property
    def skeleton_binds(self) -> list[str]:
        """The host dirs the host-derived skeleton binds read-only at the same path."""
        assert self._image is not None, "the skeleton is loaded at start (preflight), before any sandbox"
        return self._image["binds"]

    @property
    def owner(self) -> str:
        return self.registry.owner

    def _defer(self, message: str) -> None:
        log.warning("deferred: %s", message)
        self.deferred_errors = [*self.deferred_errors[-49:], message]

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        lock = self._locks.get(sandbox_id)
        if lock is None:
            lock = self._locks[sandbox_id] = asyncio.Lock()
        return lock

    def _cgroup(self, sandbox_id: str) -> SandboxCgroup:
        return SandboxCgroup(self.layout, self.config.cgroup_parent, self._native_name(sandbox_id))

    def _native_name(self, sandbox_id: str) -> str:
        """The name of the sandbox's cgroup: its ID, or the warm member's it was claimed from (cgroup v2 refuses
        to rename a cgroup, so a claim keeps it; the record, then its tombstone, carries the alias)."""
        rec = self.records.get(sandbox_id)
        if rec is not None:
            return rec.native_name or sandbox_id
        tomb = self.pending_reclaim.get(sandbox_id)
        name = tomb.data.get("native_name") if tomb is not None else None
        return name if isinstance(name, str) else sandbox_id

    def _upper(self, sandbox_id: str) -> Path:
        """The sandbox's overlay upper layer: its quota'd subvolume, or a dir of its sandbox dir."""
        if self._pool is not None:
            return self._pool.upper(sandbox_id)
        return self.registry.sandbox_dir(sandbox_id) / "upper"

    @staticmethod
    def _transition(rec: SandboxRecord, state: State, **changes: Any) -> SandboxRecord:
        """The record after a validated ``rec.state -> state`` transition (neither persisted nor published)."""
        check_transition(rec.sandbox_id, rec.generation, rec.state, state, changes.get("reason") or "observed")
        # A reason describes the latest transition only; an observation without one clears the old one.
        update = {"state": state, "updated_at": time.time(), "reason": None, **changes}
        if state == rec.state and "reason" not in changes:
            update["reason"] = rec.reason
        return rec.model_copy(update=update)

    def _set_sync(self, rec: SandboxRecord, state: State, **changes: Any) -> SandboxRecord:
        """Validate the transition, persist, then publish in memory (the disk is the commit point)."""
        new = self._transition(rec, state, **changes)
        self.registry.put(new)
        self.records[rec.sandbox_id] = new
        return new

    def _persist(self, new: SandboxRecord) -> SandboxRecord:
        """Persist a change that is no state transition (the disk is the commit point), then publish it."""
        self.registry.put(new)
        self.records[new.sandbox_id] = new
        return new

    async def _set(self, rec: SandboxRecord, state: State, **changes: Any) -> SandboxRecord:
        return await asyncio.to_thread(self._set_sync, rec, state, **changes)

    def _forget(self, rec: SandboxRecord, reason: str) -> None:
        """The delete is complete (tombstone persisted, cgroup empty, lock released): release capacity last."""
        check_transition(rec.sandbox_id, rec.generation, rec.state, State.DELETED, reason)
        self.records.pop(rec.sandbox_id, None)
        self.tombstoned.add(rec.sandbox_id)
        if self.hub is not None:
            self.hub.drop_sandbox(rec.sandbox_id)  # its runtime control socket goes with it
        if self.by_request.get(rec.request_id) == rec.sandbox_id:
            del self.by_request[rec.request_id]

    def _reserved(self) -> Resources:
        items = [r.resources for r in self.records.values()]
        # A tombstoned sandbox whose reclaim is pending stays reserved (once, even while its record lingers).
        items += [t.resources for sid, t in self.pending_reclaim.items() if sid not in self.records]
        return Resources(
            cpu_millis=sum(r.cpu_millis for r in items),
            memory_bytes=sum(r.memory_bytes for r in items),
            pids_max=sum(r.pids_max for r in items),
            disk_bytes=sum(r.disk_bytes for r in items),
        )

    def _auth(self, ref: SandboxRef) -> SandboxRecord:
        """SBX-4: owner, sandbox ID, secret token and generation must all match."""
        self.registry.check_usable()
        if ref.owner is not None and ref.owner != self.owner:
            raise PermissionDeniedError(f"owner {ref.owner} is not this sandboxd's owner")
        rec = self.records.get(ref.sandbox_id)
        if rec is None:
            if ref.sandbox_id in self.tombstoned:
                raise NotFoundError(f"sandbox {ref.sandbox_id} was deleted", details={"tombstone": True})
            raise NotFoundError(f"no sandbox {ref.sandbox_id}")
        self._check_token(ref, rec)
        if ref.generation != rec.generation:
            raise ConflictError(
                f"sandbox {ref.sandbox_id} is generation {rec.generation}, not {ref.generation}",
                details={"generation": rec.generation},
            )
        return rec

    @staticmethod
    def _check_token(ref: SandboxRef, rec: SandboxRecord) -> None:
        if not hmac.compare_digest(ref.token.encode(), rec.token.encode()):
            why = "; its owner replaced it (Reclaim)" if rec.reclaimed_at is not None else ""
            raise PermissionDeniedError(f"invalid token for sandbox {ref.sandbox_id}{why}")

    def _current(self, ref: SandboxRef) -> SandboxRecord | None:
        """Under the sandbox's lock, after ``_auth``: the record now (None: deleted meanwhile), its token checked
        again. A Reclaim that ran while this call waited for the lock voided the token the call was
        authenticated with: the old holder can do nothing more from that moment."""
        rec = self.records.get(ref.sandbox_id)
        if rec is not None:
            self._check_token(ref, rec)
        return rec

    def _deleted(self, sandbox_id: str) -> NotFoundError:
        return NotFoundError(f"sandbox {sandbox_id} was deleted", details={"tombstone": True})
