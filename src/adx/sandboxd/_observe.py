"""Reads: a sandbox's native state (identity-bound cgroup, lifecycle lock, exit record) mapped to its record
(SBX-2, SBX-5, SBX-8), and the read calls built on it (Get, List, Wait, Stats, Output, Resource, Health)."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from pathlib import Path
from typing import TypedDict

from adx.errors import AdxError, ConflictError, UnavailableError
from adx.sandboxd._cgroups import SandboxCgroup
from adx.sandboxd._host_resources import read_resource, tree_bytes
from adx.sandboxd._layers import output_tail
from adx.sandboxd._models import (
    CgroupsInfo,
    ExitStatus,
    Health,
    ListResponse,
    NativeIdentity,
    OutputResponse,
    ResourceInfo,
    SandboxInfo,
    SandboxRecord,
    SandboxRef,
    Stats,
    WaitRequest,
    WaitResponse,
)
from adx.sandboxd._preflight import HostPreflight
from adx.sandboxd._sandbox_layout import EXECD_SOCKET_NAMES, LOCK_FILE, OUTPUT_LOG, SOCKETS_DIR
from adx.sandboxd._states import ALLOWED, TERMINAL_FOR_WAIT, State

__all__ = ["SandboxObserver"]

log = logging.getLogger("adx.sandboxd")


class Observed(TypedDict, total=False):
    """What a native observation changes on a record besides its state (``_set_sync``'s keywords)."""

    reason: str
    native: NativeIdentity
    exit: ExitStatus


def _lock_held(path: Path) -> bool:
    """True when another open file description holds ``path``'s flock (the supervisor is alive)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our lock at once if we got it
    return False


#: The record's fields a SandboxInfo shows as stored (every field the two declare alike); the rest of the info is
#: derived below. Only what SandboxInfo declares is copied, so a record's secrets (its token) never leak.
_SHOWN_AS_STORED = tuple(name for name in SandboxInfo.model_fields if name in SandboxRecord.model_fields)


class SandboxObserver(HostPreflight):
    """Native observation and reconciliation of records, and the read-only API."""

    def _info(self, rec: SandboxRecord, observation_error: str | None = None) -> SandboxInfo:
        veth = self.veth_pool.veth(rec.sandbox_id, rec.net_index)
        sdir = self.registry.sandbox_dir(rec.sandbox_id)
        return SandboxInfo(
            **{name: getattr(rec, name) for name in _SHOWN_AS_STORED},
            owner=self.owner,
            run_dir=str(sdir / "run"),
            execd_socket=str(sdir / SOCKETS_DIR / EXECD_SOCKET_NAMES[0]) if rec.execd else None,
            execd_admin_socket=str(sdir / SOCKETS_DIR / EXECD_SOCKET_NAMES[1]) if rec.execd else None,
            address=veth.sandbox_ip if veth else None,
            host_address=veth.host_ip if veth else None,
            network_policy=rec.net_policy,
            observation_error=observation_error,
        )

    def _native_of(self, rec: SandboxRecord) -> NativeIdentity | None:
        if rec.native is not None:
            return rec.native
        return self.registry.read_native(rec.sandbox_id)

    def _ours(self, native: NativeIdentity | None, cg: SandboxCgroup) -> str:
        """'ours', 'vanished' or 'replaced': is the cgroup on disk the one this record created? (SBX-5, SBX-8)"""
        if native is None:
            return "vanished" if cg.identity() is None else "replaced"
        if native.boot_id != self.boot_id:
            return "vanished"  # a reboot killed everything of the old boot
        ident = cg.identity()
        if ident is None:
            return "vanished"
        return "ours" if ident == (native.cgroup_dev, native.cgroup_ino) else "replaced"

    def _observe(self, rec: SandboxRecord) -> tuple[State, Observed]:
        """Native state of a started sandbox: Running/Paused/Stopped(Terminated)/Missing(Failed)."""
        native = self._native_of(rec)
        if native is None:
            if rec.state == State.CREATING:
                return State.CREATING, {}
            return State.FAILED, {"reason": "no native identity was ever recorded"}
        cg = self._cgroup(rec.sandbox_id)
        where = self._ours(native, cg)
        if where != "ours":
            why = "host rebooted" if native.boot_id != self.boot_id else f"cgroup {where}"
            return State.FAILED, {"reason": f"native sandbox missing ({why})", "native": native}
        sdir = self.registry.sandbox_dir(rec.sandbox_id)
        exited = self.registry.read_exit(rec.sandbox_id)
        if exited is None and _lock_held(sdir / LOCK_FILE):
            return (State.PAUSED if cg.frozen() else State.RUNNING), {"native": native}
        exited = exited or self.registry.read_exit(rec.sandbox_id)  # it may have landed meanwhile
        if exited is not None:
            return State.TERMINATED, {"exit": exited, "native": native}
        if not cg.is_empty():
            # Supervisor lost (killed) but the workload lives, unsupervised; a frozen one is still paused (calling
            # it running would let a Checkpoint thaw what its caller paused).
            if cg.frozen():
                return State.PAUSED, {"native": native, "reason": "supervisor lost; workload frozen"}
            return State.RUNNING, {"native": native, "reason": "supervisor lost; workload still running"}
        return State.TERMINATED, {"exit": ExitStatus(known=False), "native": native}

    def _adopting(self, rec: SandboxRecord, state: State, native: NativeIdentity | None) -> SandboxRecord:
        """The record to apply an observation of ``state`` to: a started create (native identity recorded)
        still persisted ``creating`` is first what its create replied, Running (SBX-2: that Running is published,
        not persisted), so an observation only reachable from Running (Paused) settles it too."""
        if rec.state != State.CREATING or native is None or state == State.CREATING or state in ALLOWED[rec.state]:
            return rec
        return self._transition(rec, State.RUNNING, native=native, reason="started (adopted by native observation)")

    def _reconcile_sync(self, sandbox_id: str) -> tuple[SandboxRecord, str | None]:
        rec = self.records[sandbox_id]
        if rec.state == State.STOPPING:
            return rec, None  # the persisted intent rules; queries never override it (SBX-2)
        # (A record is creating here only after a startup that could not settle it: an in-flight create holds
        # the sandbox's lock, which every reconciling call takes. Its supervisor's identity settles it, through
        # the Running its create replied with when the observation is Paused.)
        try:
            state, changes = self._observe(rec)
        except OSError as exc:
            # SBX-6/13: an unavailable native query invents nothing.
            return rec, f"native query failed: {exc}"
        if state == rec.state and all(getattr(rec, k) == v for k, v in changes.items() if k != "reason"):
            return rec, None
        base = self._adopting(rec, state, changes.get("native"))
        if state != base.state and state not in ALLOWED[base.state]:
            return rec, None
        return self._set_sync(base, state, **changes), None

    async def _reconcile(self, sandbox_id: str) -> tuple[SandboxRecord, str | None]:
        return await asyncio.to_thread(self._reconcile_sync, sandbox_id)

    async def get(self, ref: SandboxRef) -> SandboxInfo:
        rec = self._auth(ref)
        async with self._lock(rec.sandbox_id):
            if self._current(ref) is None:
                raise self._deleted(rec.sandbox_id)
            rec, err = await self._reconcile(rec.sandbox_id)
            return self._info(rec, err)

    async def list(self) -> ListResponse:
        self.registry.check_usable()
        # SBX-11: list returns the persisted observations; only Get/Wait query the native side.
        return ListResponse(
            sandboxes=[self._info(r) for r in sorted(self.records.values(), key=lambda r: r.created_at)]
        )

    async def wait(self, req: WaitRequest) -> WaitResponse:
        rec = self._auth(req.ref)
        sandbox_id = rec.sandbox_id
        deadline = time.monotonic() + min(req.timeout_seconds, self.config.max_wait_seconds)
        v2_dir = self._cgroup(sandbox_id).v2_dir
        # Woken by the exit record's arrival, the cgroup's events and any change of the record (_wait_watch);
        # the full native query (a thread) runs then, and now and then as a safety net.
        sub = self.wait_watch.subscribe(
            sandbox_id, str(self.registry.sandbox_dir(sandbox_id)), v2_dir and f"{v2_dir}/cgroup.events"
        )
        try:
            next_full = 0.0
            last = self._info(rec)
            while True:
                now = time.monotonic()
                current = self.records.get(sandbox_id)
                if current is None:
                    return WaitResponse(done=True, sandbox=last.model_copy(update={"state": State.DELETED}))
                self._check_token(req.ref, current)  # a Reclaim meanwhile ends the old holder's wait
                if sub.fired or now >= next_full:
                    sub.clear()
                    next_full = now + sub.full_check_seconds
                    async with self._lock(sandbox_id):
                        if sandbox_id in self.records:
                            current, _ = await self._reconcile(sandbox_id)
                    last = self._info(current)
                if current.state in TERMINAL_FOR_WAIT:
                    return WaitResponse(done=True, sandbox=self._info(current))
                if now >= deadline:
                    return WaitResponse(done=False, sandbox=last)
                await sub.sleep(min(next_full, deadline) - time.monotonic())
        finally:
            self.wait_watch.unsubscribe(sub)

    async def stats(self, ref: SandboxRef) -> Stats:
        rec = self._auth(ref)

        def read() -> Stats:
            cg = self._cgroup(rec.sandbox_id)
            if self._ours(self._native_of(rec), cg) != "ours":
                raise ConflictError(f"sandbox {rec.sandbox_id} has no live cgroup", details={"state": str(rec.state)})
            # Stats is the cgroup's numbers (CgroupStats, field for field) plus the sandbox's and the disk's.
            return Stats(
                sandbox_id=rec.sandbox_id,
                **vars(cg.stats()),
                disk_bytes=tree_bytes(self._upper(rec.sandbox_id)),
                observed_at=time.time(),
            )

        return await asyncio.to_thread(read)

    async def output(self, ref: SandboxRef) -> OutputResponse:
        """The tail of PID 1's stdout/stderr (a build step's output)."""
        rec = self._auth(ref)
        text, truncated = await asyncio.to_thread(output_tail, self.registry.sandbox_dir(rec.sandbox_id) / OUTPUT_LOG)
        return OutputResponse(output=text, truncated=truncated)

    def _refresh_resource(self) -> ResourceInfo:
        """A new resource sample; a failure keeps the last one (it ages out of ``resource_fresh``) and is
        reported by health (RES-8) and to the caller."""
        try:
            info = read_resource(self.config, self.capacity, self._reserved(), len(self.records))
        except (OSError, AdxError) as exc:
            self._resource_error = str(exc)
            log.warning("resource refresh failed: %s", exc)
            raise UnavailableError(f"resource refresh failed: {exc}") from None
        self._resource_error = None
        self._resource = info
        return info

    async def resource(self) -> ResourceInfo:
        info = await asyncio.to_thread(self._refresh_resource)
        return info

    async def health(self) -> Health:
        res = self._resource
        observed = res.observed_at if res else 0.0
        age = max(0.0, time.time() - observed)
        fresh = age <= 3 * self.config.resource_refresh_seconds
        spawner = self.spawner.alive()
        storage_ok = self.registry.storage_failed is None
        return Health(
            ok=spawner and storage_ok and fresh,
            owner=self.owner,
            pid=os.getpid(),
            started_at=self.started_at,
            storage_failed=not storage_ok,
            spawner_alive=spawner,
            cgroups=CgroupsInfo(**self.layout.describe()),
            resource_observed_at=observed,
            resource_age_seconds=age,
            resource_fresh=fresh,
            resource_error=self._resource_error,
            state_dir=str(self.config.state_dir),
            image_store=str(self.config.images_root / "store"),
            deferred_errors=list(self.deferred_errors),
            runtime_control_socket=str(self.config.runtime_control_socket),
            artifact_roots={name: str(path) for name, path in self.config.artifact_roots().items()},
            user_namespace=self._userns,
            user_namespace_note=self._userns_note,
            disk_quota=self._pool is not None,
            disk_quota_note=self._disk_quota_note,
            warm_pool=self.warm.info(),
        )
