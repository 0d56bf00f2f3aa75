"""Startup (SBX-10), synchronous, before the event loop and before any thread exists: open the registry,
preflight, re-install network policies, finish interrupted deletes, reclaims and creates, and map every
other record to its native state."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time

from adx.errors import AdxError, UnavailableError
from adx.sandboxd._cgroups import SandboxCgroup
from adx.sandboxd._delete import SandboxDeleter
from adx.sandboxd._layers import ensure_mountpoints
from adx.sandboxd._models import Resources, SandboxRecord
from adx.sandboxd._registry import LoadedRegistry, Tombstone
from adx.sandboxd._sandbox_layout import LOCK_FILE
from adx.sandboxd._states import State
from adx.sandboxd._veth import host_if_of
from adx.sandboxd._wait_watch import RecordTable
from adx.sandboxd._warm_pool import WARM_ID_PREFIX

__all__ = ["StartupReconcile"]

log = logging.getLogger("adx.sandboxd")


class StartupReconcile(SandboxDeleter):
    """The daemon's start: everything up to serving."""

    def load(self) -> LoadedRegistry:
        """SBX-10 step 1: open and validate; raises RegistryError without changing anything."""
        return self.registry.load()

    def start(self, loaded: LoadedRegistry) -> None:
        """SBX-10: storage init/migration, native preflight, delete retries, reconciliation."""
        missing = self.layout.missing()
        if missing:
            raise UnavailableError(f"cgroup controllers unavailable on this host: {', '.join(missing)}")
        self.registry.initialize(loaded)
        log.info("registry open", extra={"owner": self.owner, "records": len(loaded.records)})
        self._preflight()
        if self.config.defaults.tmp_bytes is not None:
            log.warning(
                "defaults.tmp_bytes is set but bounds nothing: /tmp is part of each sandbox's writable layer "
                "(kept by checkpoints), limited only by what limits that layer; remove the key"
            )
        self.registry.remove_spares()  # an earlier run's: never a sandbox's (nor its warm members' dirs)
        self._sweep_warm_cgroups(
            {r.native_name for r in loaded.records.values() if r.native_name}
            | {str(t.data["native_name"]) for t in loaded.tombstones.values() if t.data.get("native_name")}
        )
        self.spares.fill()
        self.spawner.start()
        self.records = RecordTable(self.wait_watch.poke, loaded.records)
        # After the records: the fresh table must hold the policy of every veth sandboxd that outlived the last
        # daemon (set up before them, it held none and their egress was open), and before any delete below
        # (removing a chain needs the table).
        self._start_netfilter()
        # Layer references of sandboxes deleted while no daemon ran: their layers may be collected now.
        self.images.release_all_but(set(self.records))
        # Below every store image: held by the daemon itself ('_' is never in a sandbox ID), so no GC takes it.
        self.images.hold("_mountpoints", [ensure_mountpoints(self.images)])
        self.tombstoned = set(loaded.tombstones) | set(loaded.uncommitted)
        self.by_request = {r.request_id: r.sandbox_id for r in self.records.values()}
        self.veth_pool.resume_after(r.net_index for r in self.records.values() if r.net_index is not None)
        for sandbox_id, tomb in loaded.tombstones.items():
            if (
                self.registry.needs_reclaim(sandbox_id)
                or SandboxCgroup(
                    self.layout, self.config.cgroup_parent, str(tomb.data.get("native_name") or sandbox_id)
                ).exists()
            ):
                # An interrupted reclaim continues from the tombstone; until it is done it stays reserved.
                self.pending_reclaim[sandbox_id] = tomb
                self._try_reclaim(sandbox_id)
        for sandbox_id in loaded.uncommitted:
            # A create killed before its record was committed: its supervisor never started a workload (it
            # starts only a committed record), but the dir may hold what the create had made (subdirs, a temp
            # record), and a supervisor killed while preparing may have left a cgroup (its unstarted init
            # exits when the supervisor is gone).
            try:
                if self.registry.needs_reclaim(sandbox_id):
                    self.registry.reclaim(sandbox_id)
            except OSError as exc:
                self._defer(f"reclaim of uncommitted {sandbox_id} failed (the ID stays blocked; next start): {exc}")
            if self._cgroup(sandbox_id).exists():
                empty = Resources(cpu_millis=0, memory_bytes=0, pids_max=0, disk_bytes=0)
                self.pending_reclaim[sandbox_id] = Tombstone(sandbox_id, 0, empty, time.time(), {})
                self._try_reclaim(sandbox_id)
        if self._pool is not None:
            # Layers no record names and no pending reclaim still needs: creates killed before their commit.
            try:
                for name in self._pool.sweep_layers(set(self.records) | set(self.pending_reclaim)):
                    log.warning("removed the layer of an uncommitted create", extra={"sandbox_id": name})
            except (AdxError, OSError) as exc:
                self._defer(f"removing layers of uncommitted creates failed (next start): {exc}")
        for rec in list(self.records.values()):
            if rec.state == State.STOPPING:
                try:
                    self._delete_native(rec)
                    self._forget(rec, "delete intent completed at startup")
                except AdxError as exc:
                    self._defer(f"retrying delete of {rec.sandbox_id} failed: {exc}")
            elif rec.state == State.CREATING:
                try:
                    self._settle_creating(rec)
                except (AdxError, OSError) as exc:
                    self._defer(f"settling the interrupted create of {rec.sandbox_id} failed: {exc}")
            else:
                if rec.state == State.RUNNING:
                    self._thaw_unacknowledged(rec)
                try:
                    self._reconcile_sync(rec.sandbox_id)
                except AdxError as exc:
                    self._defer(f"reconciling {rec.sandbox_id} failed: {exc}")
        # A failing first refresh leaves the daemon up but not resource-fresh; health names the error (RES-8).
        with contextlib.suppress(UnavailableError):
            self._refresh_resource()

    def _sweep_warm_cgroups(self, claimed: set[str]) -> None:
        """Cgroups of an earlier run's warm pool members (``_warm_pool``; never a sandbox's: ``_`` is in no ID)
        but the ``claimed`` ones, which records or tombstones name (a claim keeps the member's cgroup). Their dirs
        went with the spares above, their layers go with the uncommitted creates' sweep below, their chains with
        the fresh nftables table, their ID ranges and /30s were only ever in that run's memory."""
        for parent in {d.parent for d in self._cgroup("probe").dirs()}:
            try:
                names = [
                    e.name
                    for e in parent.iterdir()
                    if e.name.startswith(WARM_ID_PREFIX) and e.name not in claimed and e.is_dir()
                ]
            except FileNotFoundError:
                continue
            for name in names:
                cg = self._cgroup(name)
                try:
                    cg.kill()
                    cg.wait_empty(self.config.delete_timeout_seconds)
                    cg.remove()
                    log.info("warm pool: removed an earlier run's member", extra={"member": name})
                except OSError as exc:
                    self._defer(f"removing the earlier run's warm member {name} failed: {exc}")

    def _thaw_unacknowledged(self, rec: SandboxRecord) -> None:
        """Startup, for a record persisted ``creating`` (started) or ``running``: thaw a frozen cgroup.

        A freeze is acknowledged only by a durable ``paused`` record: Pause replies after committing it, and
        Checkpoint thaws a sandbox it froze before it replies. So a frozen cgroup under any other persisted
        state was frozen by a Pause or Checkpoint that a SIGKILL cut short, whose caller holds nothing but an
        uncertain outcome (SBX-6) and may well have gone on as if it runs (a node cancels a failed pause and
        serves commands). Reporting Paused would keep it frozen for nobody; thawing completes what the caller
        knows. An acknowledged pause (persisted ``paused``) is never touched.
        """
        cg = self._cgroup(rec.sandbox_id)
        try:
            if self._ours(self._native_of(rec), cg) != "ours" or not cg.frozen():
                return
            cg.thaw()
        except OSError as exc:
            self._defer(f"thawing {rec.sandbox_id}, frozen by an operation a restart interrupted, failed: {exc}")
            return
        log.warning(
            "sandbox %s: thawed; a pause or checkpoint interrupted by a restart had frozen it, unacknowledged",
            rec.sandbox_id,
            extra={"sandbox_id": rec.sandbox_id, "generation": rec.generation, "persisted": str(rec.state)},
        )

    def _settle_creating(self, rec: SandboxRecord) -> None:
        """A record still ``creating`` on disk at startup (SBX-10, SBX-13).

        A create persists only its intent: the Running it replies with is a native observation (SBX-2) whose
        evidence is the identity the supervisor records (``native.json``) before it starts anything. So the
        reply may have been sent already: a native identity means the supervisor started, and the sandbox
        is observed like any other (Running, Paused, Terminated or Missing). Without one, the supervisor
        either never got the spec or is still preparing (cgroup, an init that waits for its word): wait for it
        while it holds its lifecycle lock; once the lock is ours and still no identity exists, nothing was
        started and the record is failed (kept reserved) under the lock, so a supervisor that takes the lock
        later sees it, does not start, and removes what it prepared.
        """
        lock_path = self.registry.sandbox_dir(rec.sandbox_id) / LOCK_FILE
        deadline = time.monotonic() + self.config.create_timeout_seconds
        while self._native_of(rec) is None:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        self._set_sync(rec, State.FAILED, reason="create interrupted by a sandboxd restart")
                        return
                else:
                    if self._native_of(rec) is None:
                        self._set_sync(rec, State.FAILED, reason="create interrupted by a sandboxd restart")
                        return
            finally:
                os.close(fd)  # drops our lock at once if we got it
            time.sleep(0.005)
        self._thaw_unacknowledged(rec)
        state, changes = self._observe(rec)
        changes.setdefault("reason", "create interrupted by a sandboxd restart; adopted by native observation")
        rec = self._adopting(rec, state, self._native_of(rec))
        self._set_sync(rec, state, **changes)

    def _start_netfilter(self) -> None:
        """A fresh table holding every live veth sandbox's policy again (names resolved anew), in one step."""
        self.netfilter.setup(
            {
                host_if_of(rec.sandbox_id, rec.native_name): rec.net_policy
                for rec in self.records.values()
                if rec.net_policy is not None
                and rec.net_index is not None
                and rec.state not in (State.STOPPING, State.FAILED)
            }
        )
