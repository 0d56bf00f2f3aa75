"""sandboxd's core: registry-backed sandbox lifecycle, startup reconciliation and maintenance.

Blocking work (fsync'd registry writes, cgroup I/O, tar) runs in worker threads via ``asyncio.to_thread``;
the event loop itself only does bookkeeping. Per-sandbox operations are serialised by a per-sandbox
``asyncio.Lock``; the cross-process exclusion with the supervisor is its ``lifecycle.lock`` flock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from adx.errors import (
    AdxError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.execd._launch import init_argv, install_runtime
from adx.images import ImageManifest, ImageStore
from adx.model import NetworkMode, NetworkPolicy
from adx.sandboxd import _checkpoint as ckpt
from adx.sandboxd._cgroups import CgroupLayout, SandboxCgroup
from adx.sandboxd._config import SandboxdConfig
from adx.sandboxd._control_hub import ControlHub
from adx.sandboxd._errors import PermissionDeniedError
from adx.sandboxd._faults import fault
from adx.sandboxd._host_resources import measure_capacity, read_resource, tree_bytes
from adx.sandboxd._image import ensure_default_image, load_image
from adx.sandboxd._layers import BaseImageBuilder, commit_upper, ensure_mountpoints, output_tail
from adx.sandboxd._logs import LogStore
from adx.sandboxd._models import (
    CheckpointInfo,
    CheckpointRef,
    CheckpointRequest,
    CommitLayerRequest,
    CommitLayerResponse,
    CreateRequest,
    CreateResponse,
    DeleteResponse,
    ExecdOptions,
    ExitStatus,
    Health,
    ListCheckpointsRequest,
    ListCheckpointsResponse,
    ListResponse,
    NativeIdentity,
    OutputResponse,
    ReclaimRequest,
    ReclaimResponse,
    ResourceInfo,
    Resources,
    RestoreRequest,
    SandboxInfo,
    SandboxRecord,
    SandboxRef,
    SetNetworkRequest,
    Stats,
    StoredCheckpoint,
    WaitRequest,
    WaitResponse,
)
from adx.sandboxd._netpolicy import NetFilter
from adx.sandboxd._registry import LoadedRegistry, Registry, Tombstone
from adx.sandboxd._sandbox_dirs import SpareDirs
from adx.sandboxd._sandbox_layout import (
    CONTROL_DIR,
    CONTROL_DIR_INSIDE,
    CONTROL_SOCKET,
    EXECD_ADMIN_SOCKET_FD,
    EXECD_MOUNT,
    EXECD_SOCKET_FD,
    EXECD_SOCKET_NAMES,
    EXIT_FILE,
    LOCK_FILE,
    OUTPUT_LOG,
    SOCKETS_DIR,
    boot_id,
)
from adx.sandboxd._spawn_client import SpawnerProcess
from adx.sandboxd._states import ALLOWED, TERMINAL_FOR_WAIT, State, check_transition
from adx.sandboxd._storage import StoragePool, pool_paths
from adx.sandboxd._userns import IDS_PER_SANDBOX, shift_tree, unsupported_reason
from adx.sandboxd._userns import allocate as allocate_ids
from adx.sandboxd._veth import VethPool, host_if

__all__ = ["SandboxService"]

log = logging.getLogger("adx.sandboxd")

#: A sandbox's default PATH.
_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


class SandboxService:
    def __init__(self, config: SandboxdConfig, layout: CgroupLayout) -> None:
        self.config = config
        self.layout = layout
        self.registry = Registry(config.state_dir, config.max_record_bytes)
        self.spawner = SpawnerProcess()
        self.records: dict[str, SandboxRecord] = {}
        self.tombstoned: set[str] = set()
        self.pending_reclaim: dict[str, Tombstone] = {}
        self.by_request: dict[str, str] = {}
        self.deferred_errors: list[str] = []
        self.started_at = time.time()
        self.boot_id = boot_id()
        self._locks: dict[str, asyncio.Lock] = {}
        self._alloc_lock: asyncio.Lock | None = None
        self._image: dict[str, Any] = {}
        self._image_root = Path()
        # Named images and their layers (``adx image``); the host-derived skeleton above stays the fallback.
        self.images = ImageStore(config.images_root / "store")
        self.base_builder = BaseImageBuilder(self.images) if config.base_image == "debian" else None
        self._pool: StoragePool | None = None  # disk_quota = 'btrfs'
        self._userns = False  # sandboxes get a user namespace each (decided at start: config and host)
        self._userns_note: str | None = None
        self.veth_pool = VethPool(config.veth_pool)
        self.netfilter = NetFilter(config.state_dir, config.veth_pool)
        self.logs = LogStore(config.state_dir / "logs")  # workload output, per group (_output, _logs)
        self._resource: ResourceInfo | None = None
        self._resource_error: str | None = None
        self.hub: ControlHub | None = None
        self.spares = SpareDirs(self.registry)
        self.capacity = Resources(cpu_millis=0, memory_bytes=0, pids_max=0, disk_bytes=0)

    @property
    def owner(self) -> str:
        return self.registry.owner

    # == startup (synchronous, before the event loop and before any thread exists) =================
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
        self.registry.remove_spares()  # an earlier run's: never a sandbox's
        self.spares.fill()
        self.spawner.start()
        self.records = dict(loaded.records)
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
                or SandboxCgroup(self.layout, self.config.cgroup_parent, sandbox_id).exists()
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

    def _adopting(self, rec: SandboxRecord, state: State, native: NativeIdentity | None) -> SandboxRecord:
        """The record to apply an observation of ``state`` to: a started create (native identity recorded)
        still persisted ``creating`` is first what its create replied, Running (SBX-2: that Running is published,
        not persisted), so an observation only reachable from Running (Paused) settles it too."""
        if rec.state != State.CREATING or native is None or state == State.CREATING or state in ALLOWED[rec.state]:
            return rec
        return self._transition(rec, State.RUNNING, native=native, reason="started (adopted by native observation)")

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

    def _preflight(self) -> None:
        """Native checks after storage init and before the API is bound."""
        for d in self._cgroup_parents():
            d.mkdir(parents=True, exist_ok=True)
        image = ensure_default_image(self.config.images_root)
        self._image = load_image(image)
        self._image_root = image / "root"
        self.images.ensure()
        if self.base_builder is not None:
            self.base_builder.start()  # a thread: minutes on a cold store, and the API must come up meanwhile
        if self.config.disk_quota == "btrfs":
            image_file, mount = pool_paths(self.config.state_dir)
            self._pool = StoragePool(image_file, mount, self.config.storage_image_bytes)
            self._pool.ensure()  # adopts the mount an earlier run left
            local = self.config.artifact_roots()["local"]
            referenced = {
                snap[0]
                for _, _, manifest in ckpt.list_artifacts(local, self.owner)
                if (snap := ckpt.snapshot_of(manifest)) is not None
            }
            for name in self._pool.sweep_snapshots(referenced):
                log.warning("removed an unreferenced checkpoint snapshot", extra={"snapshot": name})
        for root in self.config.artifact_roots().values():
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            # No capture of this daemon is in flight before it serves: its staging dirs are a crash's leftovers.
            for name in ckpt.sweep_partials(root, self.owner):
                log.warning("removed an interrupted checkpoint write", extra={"path": str(root / name)})
        for inside, host in self.config.ro_binds.items():
            if not host.is_dir():
                raise UnavailableError(f"ro_binds: host dir {host} for {inside} does not exist")
        runtime = self.config.execd_runtime
        if self.config.execd_runtime_dir is None:
            # Our own execd, from the same source as this daemon: byte-compiled once here, not per sandbox.
            install_runtime(runtime)
        elif not (runtime / "adx" / "execd" / "__main__.py").is_file():
            raise UnavailableError(f"execd_runtime_dir {runtime} holds no execd runtime (install_runtime)")
        self.spawner.execd_python = self._execd_python()
        self._decide_userns()
        self.capacity = measure_capacity(self.config)

    def _decide_userns(self) -> None:
        """``user_namespace``: 'off', 'on' (refuse to start without support) or 'auto' (on where supported)."""
        mode = self.config.user_namespace
        reason = unsupported_reason() if mode != "off" else "user_namespace = 'off' in the configuration"
        if reason is not None and mode == "on":
            raise UnavailableError(f"user_namespace = 'on' but {reason}")
        self._userns, self._userns_note = reason is None, reason
        if mode == "auto" and reason is not None:
            log.warning("sandboxes run without user namespaces (their root is host root): %s", reason)
        self.spawner.userns = self._userns

    def _under_image_binds(self, path: str) -> bool:
        """True when ``path`` inside a sandbox is the host's same path (a read-only bind of the image)."""
        return any(path == b or path.startswith(b + "/") for b in self._image["binds"])

    def _execd_python(self) -> str | None:
        """The host interpreter execd sandboxes exec by default, when PID 1 can run execd in process instead:
        our own execd runtime (the spawner imports the same modules from the same source), ``python3`` found
        under the image's host binds, and a version execd supports."""
        if not self.config.execd_in_process or self.config.execd_runtime_dir is not None:
            return None
        found = self._resolve_in_image(ExecdOptions().python, _SANDBOX_PATH)
        if found is None:
            return None
        check = [found, "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]
        ok = subprocess.run(check, capture_output=True, check=False, timeout=30).returncode == 0
        return found if ok else None

    def _resolve_in_image(self, name: str, path: str) -> str | None:
        """The host path (resolved) of the executable a sandbox finds as ``name`` on ``path``, or None when that
        is not a file of the image's host binds (or depends on what the sandbox's own layers hold)."""
        if "/" in name:
            candidates = [name] if self._under_image_binds(name) else []
        else:
            candidates = []
            for d in path.split(":"):
                if not self._under_image_binds(d):
                    break  # the sandbox's own dirs come first from here: what they hold is not ours to know
                candidates.append(f"{d}/{name}")
        for candidate in candidates:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                real = os.path.realpath(candidate)
                return real if self._under_image_binds(real) else None
        return None

    def _cgroup_parents(self) -> list[Path]:
        roots = [self.layout.v2_root] if self.layout.v2_root else []
        roots += list(dict.fromkeys(self.layout.v1_mounts.values()))
        return [r / self.config.cgroup_parent for r in roots]

    def _defer(self, message: str) -> None:
        log.warning("deferred: %s", message)
        self.deferred_errors = [*self.deferred_errors[-49:], message]

    async def attach(self) -> None:
        self._alloc_lock = asyncio.Lock()
        await self.spawner.attach()

    async def start_control(self) -> None:
        """Runtime control (CTL-2/3): the node-level subscription socket, then one control socket per execd
        sandbox that may still run, so execds that outlived a sandboxd restart reconnect."""
        path = self.config.runtime_control_socket
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
        self.hub = ControlHub(path, allowed_uid=os.getuid(), verify_execd=self._is_init_of)
        await self.hub.start()
        for rec in list(self.records.values()):
            if rec.execd is not None and rec.state in (State.RUNNING, State.PAUSED, State.CREATING):
                try:
                    await self._register_control(rec.sandbox_id)
                except OSError as exc:
                    self._defer(f"runtime control socket of {rec.sandbox_id}: {exc}")

    def _is_init_of(self, sandbox_id: str, pid: int) -> bool:
        """Only the sandbox's PID 1 (execd) may report for it: a workload process inside could otherwise
        connect to the control socket, impersonate execd and kick its connection off."""
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cgroups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if len(nspid) < 2 or nspid[-1] != "1":
            return False
        own = f"/{self.config.cgroup_parent}/{sandbox_id}"
        return any(line.rpartition(":")[2] == own for line in cgroups.splitlines())

    async def _register_control(self, sandbox_id: str) -> None:
        if self.hub is not None and not self.hub.registered(sandbox_id):
            sdir = self.registry.sandbox_dir(sandbox_id)
            await self.hub.add_sandbox(sandbox_id, sdir / CONTROL_DIR / CONTROL_SOCKET)

    def _unregister_control(self, sandbox_id: str) -> None:
        if self.hub is not None:
            self.hub.drop_sandbox(sandbox_id)

    async def close(self) -> None:
        if self.hub is not None:
            await self.hub.stop()
        await self.spawner.close()
        try:
            # The brief's rule: the table lives as long as the daemon; a restart re-installs every policy.
            await asyncio.to_thread(self.netfilter.teardown)
        except AdxError as exc:
            log.warning("nftables table not removed: %s", exc)

    def _start_netfilter(self) -> None:
        """A fresh table holding every live veth sandbox's policy again (names resolved anew), in one step."""
        self.netfilter.setup(
            {
                host_if(rec.sandbox_id): rec.net_policy
                for rec in self.records.values()
                if rec.net_policy is not None
                and rec.net_index is not None
                and rec.state not in (State.STOPPING, State.FAILED)
            }
        )

    # == helpers ====================================================================================
    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        lock = self._locks.get(sandbox_id)
        if lock is None:
            lock = self._locks[sandbox_id] = asyncio.Lock()
        return lock

    def _cgroup(self, sandbox_id: str) -> SandboxCgroup:
        return SandboxCgroup(self.layout, self.config.cgroup_parent, sandbox_id)

    def _info(self, rec: SandboxRecord, observation_error: str | None = None) -> SandboxInfo:
        veth = self.veth_pool.veth(rec.sandbox_id, rec.net_index)
        sdir = self.registry.sandbox_dir(rec.sandbox_id)
        return SandboxInfo(
            sandbox_id=rec.sandbox_id,
            generation=rec.generation,
            owner=self.owner,
            state=rec.state,
            request_id=rec.request_id,
            argv=rec.argv,
            init_argv=rec.init_argv,
            cwd=rec.cwd,
            network=rec.network,
            resources=rec.resources,
            metadata=rec.metadata,
            created_at=rec.created_at,
            updated_at=rec.updated_at,
            expires_at=rec.expires_at,
            native=rec.native,
            exit=rec.exit,
            reason=rec.reason,
            restored_from=rec.restored_from,
            run_dir=str(sdir / "run"),
            execd=rec.execd,
            execd_socket=str(sdir / SOCKETS_DIR / EXECD_SOCKET_NAMES[0]) if rec.execd else None,
            execd_admin_socket=str(sdir / SOCKETS_DIR / EXECD_SOCKET_NAMES[1]) if rec.execd else None,
            address=veth.sandbox_ip if veth else None,
            host_address=veth.host_ip if veth else None,
            network_policy=rec.net_policy,
            observation_error=observation_error,
            reclaimed_at=rec.reclaimed_at,
            id_base=rec.id_base,
        )

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
        self._unregister_control(rec.sandbox_id)
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

    # == native observation ========================================================================
    def _native_of(self, rec: SandboxRecord) -> NativeIdentity | None:
        if rec.native is not None:
            return rec.native
        raw = self.registry.read_native(rec.sandbox_id)
        if raw is None:
            return None
        try:
            return NativeIdentity.model_validate(raw)
        except ValidationError:
            return None

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

    def _observe(self, rec: SandboxRecord) -> tuple[State, dict[str, Any]]:
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
        exit_raw = self.registry.read_exit(rec.sandbox_id)
        if exit_raw is None and _lock_held(sdir / LOCK_FILE):
            return (State.PAUSED if cg.frozen() else State.RUNNING), {"native": native}
        exit_raw = exit_raw or self.registry.read_exit(rec.sandbox_id)  # it may have landed meanwhile
        if exit_raw is not None:
            return State.TERMINATED, {"exit": ExitStatus.model_validate(exit_raw), "native": native}
        if not cg.is_empty():
            # Supervisor lost (killed) but the workload lives, unsupervised; a frozen one is still paused (calling
            # it running would let a Checkpoint thaw what its caller paused).
            if cg.frozen():
                return State.PAUSED, {"native": native, "reason": "supervisor lost; workload frozen"}
            return State.RUNNING, {"native": native, "reason": "supervisor lost; workload still running"}
        return State.TERMINATED, {"exit": ExitStatus(known=False), "native": native}

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

    # == delete (SBX-7, SBX-12) ====================================================================
    def _delete_native(self, rec: SandboxRecord) -> None:
        """Kill by identity-bound cgroup, take the lifecycle lock, prove empty, tombstone, reclaim.

        Raises (keeping the Stopping record and reservation) when absence cannot be proven.
        """
        sandbox_id = rec.sandbox_id
        fault("delete.native")
        sdir = self.registry.sandbox_dir(sandbox_id)
        cg = self._cgroup(sandbox_id)
        timeout = self.config.delete_timeout_seconds
        if self._ours(self._native_of(rec), cg) == "ours":
            cg.kill()
        lock_fd = os.open(sdir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + timeout
            next_kill = time.monotonic() + 0.1
            while True:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    now = time.monotonic()
                    if now > deadline:
                        raise UnavailableError(
                            f"sandbox {sandbox_id}: supervisor still holds the lifecycle lock after {timeout}s; "
                            "delete stays pending",
                            details={"sandbox_id": sandbox_id},
                        ) from None
                    if now > next_kill:
                        # A start racing the intent may have cloned after our first kill: kill again.
                        if self._ours(self._native_of(rec), cg) == "ours":
                            cg.kill()
                        next_kill = now + 0.1
                    time.sleep(0.002)
            # Under the lock no process can start any more (the supervisor only starts under it).
            native = self._native_of(rec)
            where = self._ours(native, cg)
            if where == "ours":
                cg.kill()
                if not cg.wait_empty(timeout):
                    raise UnavailableError(
                        f"sandbox {sandbox_id}: cgroup not empty {timeout}s after cgroup.kill; delete stays pending",
                        details={"sandbox_id": sandbox_id},
                    )
            elif where == "replaced" and native is not None:
                log.warning("sandbox %s: cgroup was replaced by another; not touching it", sandbox_id)
            if rec.net_index is not None:
                self.netfilter.remove(host_if(rec.sandbox_id))  # the veth died with the namespace; now its rules
            tomb = self.registry.write_tombstone(rec, {"cgroup": where, "reason": "deleted", "id_base": rec.id_base})
            fault("delete.after_tombstone")
            self.pending_reclaim[sandbox_id] = tomb
            if where in ("ours", "vanished") or native is None:
                self._try_reclaim(sandbox_id, raise_errors=True)
            else:
                self.registry.reclaim(sandbox_id)
                self.pending_reclaim.pop(sandbox_id, None)
        finally:
            os.close(lock_fd)  # releases the lifecycle lock

    def _try_reclaim(self, sandbox_id: str, raise_errors: bool = False) -> None:
        try:
            cg = self._cgroup(sandbox_id)
            if cg.exists() and not cg.is_empty():
                raise UnavailableError(f"sandbox {sandbox_id}: tombstoned cgroup has processes")
            cg.remove()
            if self._pool is not None:
                self._pool.delete(sandbox_id)
            self.registry.reclaim(sandbox_id)
        except (OSError, AdxError) as exc:
            msg = f"reclaim of {sandbox_id} failed (reservation kept, retried): {exc}"
            if raise_errors:
                raise UnavailableError(msg) from exc
            self._defer(msg)
            return
        self.pending_reclaim.pop(sandbox_id, None)

    async def _finish_delete(self, rec: SandboxRecord, reason: str) -> None:
        await asyncio.to_thread(self._delete_native, rec)
        self.images.release(rec.sandbox_id)  # one unlink: its layers may be collected from now on
        self._forget(rec, reason)

    # == API ========================================================================================
    async def create(self, req: CreateRequest, restore: tuple[Path, dict[str, Any]] | None = None) -> CreateResponse:
        self.registry.check_usable()
        digest = hashlib.sha256(json.dumps(req.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
        assert self._alloc_lock is not None
        async with self._alloc_lock:
            existing = self.by_request.get(req.request_id)
            if existing is not None:
                rec = self.records[existing]
                if rec.request_digest != digest:
                    raise ConflictError(
                        f"request_id {req.request_id} was used for a different create",
                        details={"sandbox_id": existing},
                    )
            else:
                rec = self._reserve(req, digest, restore)
        if existing is not None:
            async with self._lock(existing):  # a concurrent duplicate waits for the first to finish
                current = self.records.get(existing)
                if current is None:
                    raise UnavailableError(
                        f"the create with request_id {req.request_id} failed and was cleaned up; it may be retried",
                        details={"sandbox_id": existing},
                    )
                if current.reclaimed_at is not None:
                    # A replayed create must not hand the create's holder the token that replaced its own.
                    raise ConflictError(
                        f"request_id: the create {req.request_id} made sandbox {existing}, whose owner has since "
                        "replaced its token (Reclaim); the create's reply is void",
                        details={"field": "request_id", "sandbox_id": existing},
                    )
                return CreateResponse(sandbox=self._info(current), token=current.token)
        async with self._lock(rec.sandbox_id):
            return await self._create_locked(rec, restore)

    def _reserve(self, req: CreateRequest, digest: str, restore: tuple[Path, dict[str, Any]] | None) -> SandboxRecord:
        d = self.config.defaults
        if req.sandbox_id is not None:
            sandbox_id = req.sandbox_id
            if sandbox_id in self.records or sandbox_id in self.tombstoned:
                raise ConflictError(
                    f"sandbox ID {sandbox_id} was used before; IDs are never reused", details={"sandbox_id": sandbox_id}
                )
        else:
            sandbox_id = f"sb-{secrets.token_hex(10)}"
        res = Resources(
            cpu_millis=req.resources.cpu_millis or d.cpu_millis,
            memory_bytes=req.resources.memory_bytes or d.memory_bytes,
            pids_max=req.resources.pids_max or d.pids_max,
            disk_bytes=req.resources.disk_bytes if req.resources.disk_bytes is not None else d.disk_bytes,
        )
        if len(self.records) + len(self.pending_reclaim) >= self.config.capacity.max_sandboxes:
            raise ConflictError("sandbox count limit reached", details={"limit": self.config.capacity.max_sandboxes})
        reserved = self._reserved()
        # CPU is admitted up to capacity x cpu_overcommit (each sandbox still gets its own CPU limit); memory and
        # disk up to capacity: the same formula as the node and the Coordinator (adx.model.admission_limit).
        ratio = self.config.capacity.cpu_overcommit
        for name in ("cpu_millis", "memory_bytes", "disk_bytes"):
            want, have, used = getattr(res, name), getattr(self.capacity, name), getattr(reserved, name)
            if name == "cpu_millis":
                have = math.floor(have * ratio)
            if used + want > have:
                raise ConflictError(
                    f"insufficient {name}: {want} requested, {have - used} of {have} free",
                    details={"resource": name, "requested": want, "free": have - used},
                )
        network = req.network or d.network
        policy = req.network_policy
        if policy is not None:
            network = "veth" if policy.mode is NetworkMode.EGRESS else "none"
        elif network == "veth":
            policy = d.network_policy or NetworkPolicy(mode=NetworkMode.EGRESS)
        layers, manifest, user = self._resolve_image(req, restore)
        env = {**manifest.env, **req.env} if manifest is not None else req.env
        cwd = req.cwd or (manifest.workdir if manifest is not None else "/work")
        now = time.time()
        rec = SandboxRecord(
            sandbox_id=sandbox_id,
            generation=req.generation,
            token=req.token or secrets.token_urlsafe(32),
            state=State.CREATING,
            request_id=req.request_id,
            request_digest=digest,
            argv=req.argv,
            init_argv=self._execd_argv(sandbox_id, req.argv, req.execd, user)
            if req.execd
            else (req.init_argv or req.argv),
            execd=req.execd,
            env=env,
            cwd=cwd,
            network=network,
            net_policy=policy if network == "veth" else None,
            resources=res,
            metadata=req.metadata,
            log_group=req.log_group,
            created_at=now,
            updated_at=now,
            expires_at=now + req.ttl_seconds if req.ttl_seconds else None,
            restored_from=restore[1]["checkpoint_id"] if restore else None,
            net_index=self.veth_pool.allocate({r.net_index for r in self.records.values() if r.net_index is not None})
            if network == "veth"
            else None,
            id_base=self._allocate_ids(restore[1]["spec"].get("id_base") if restore else None),
            image=req.image,
            image_layers=layers,
            image_user=user,
        )
        self.records[sandbox_id] = rec  # reserved from here on
        self.by_request[req.request_id] = sandbox_id
        return rec

    def _resolve_image(
        self, req: CreateRequest, restore: tuple[Path, dict[str, Any]] | None
    ) -> tuple[list[str] | None, ImageManifest | None, str | None]:
        """(store layers bottom first, or None for the host-derived skeleton; the manifest; the user execd runs
        commands as). A restore mounts the very layers its checkpoint was taken on, whatever the name means now.
        Store images get sandboxd's mount-point layer below their own (``_layers.ensure_mountpoints``)."""
        manifest = None
        user = None
        if restore is not None:
            layers = restore[1]["spec"].get("image_layers")
            user = restore[1]["spec"].get("image_user")
            field = "image"
        elif req.image_layers is not None:
            layers, field = list(req.image_layers), "image_layers"
        else:
            name = req.image or "base"
            if name == "host" or (name == "base" and self.base_builder is None):
                return None, None, None  # the host-derived skeleton
            if name == "base" and self.base_builder is not None:
                self.base_builder.check_ready()  # 503 with the build's progress until the Debian base exists
            manifest = self.images.find(name)
            if manifest is None:
                raise InvalidInputError(
                    "image", f"no image named {name!r} on this node (see adx image list)", details={"image": name}
                )
            layers, field = list(manifest.layers), "image"
            user = None if manifest.user in ("root", "0") else manifest.user
        if layers is None:
            return None, None, None
        base = ensure_mountpoints(self.images)  # a few empty dirs: made on first need, found after
        if layers[:1] != [base]:
            layers.insert(0, base)
        self._check_layers(layers, field)
        return layers, manifest, user

    def _check_layers(self, layers: list[str], field: str) -> None:
        missing = [d for d in layers if not self.images.has_layer(d)]
        if missing:
            raise InvalidInputError(
                field,
                f"layers missing from this node's image store: {', '.join(d[:12] for d in missing)}",
                details={"missing": missing},
            )

    @staticmethod
    def _execd_argv(sandbox_id: str, workload: list[str], opts: ExecdOptions, user: str | None = None) -> list[str]:
        extra = ["--grace-seconds", str(opts.grace_seconds)]
        if user is not None:
            extra += ["--user", user]
        if not workload or not opts.exit_with_workload:
            extra.append("--keep-running-after-workload-exit")
        if opts.probe is not None:
            if opts.probe.command is not None:
                extra += ["--probe-command", opts.probe.command]
            else:
                extra += ["--probe-tcp-port", str(opts.probe.tcp_port)]
            extra += ["--probe-interval", str(opts.probe.interval_seconds)]
            extra += ["--probe-timeout", str(opts.probe.timeout_seconds)]
        return init_argv(
            python=opts.python,
            socket=None,
            socket_fd=EXECD_SOCKET_FD,
            admin_socket_fd=EXECD_ADMIN_SOCKET_FD,
            control_socket=f"{CONTROL_DIR_INSIDE}/{CONTROL_SOCKET}",
            sandbox_id=sandbox_id,
            execution_id=opts.execution_id,
            workload=workload,
            extra=extra,
        )

    def _allocate_ids(self, prefer: int | None) -> int | None:
        """The new sandbox's slice of ``id_range`` (None without user namespaces). Taken: every record's, and a
        deleted sandbox's until its reclaim is done (a process of it may live on until then)."""
        if not self._userns:
            return None
        used = {r.id_base for r in self.records.values() if r.id_base is not None}
        used |= {int(t.data["id_base"]) for t in self.pending_reclaim.values() if t.data.get("id_base") is not None}
        return allocate_ids(used, self.config.id_range.start, self.config.id_range.count, prefer)

    def _unreserve(self, rec: SandboxRecord) -> None:
        self.records.pop(rec.sandbox_id, None)
        if self.by_request.get(rec.request_id) == rec.sandbox_id:
            del self.by_request[rec.request_id]

    def _commit_created(self, rec: SandboxRecord, lock_fd: int) -> None:
        """Commit point: the record (temp, fsync, rename), then the lifecycle lock is released (the supervisor,
        which checks the record under that lock, may start), then the directory fsyncs (awaited before any
        reply): the ID survives a crash. Raises UncertainOutcomeError when storage failed (the flag is set)."""
        try:
            if rec.image_layers:
                self.images.hold(rec.sandbox_id, rec.image_layers)  # before the record: never an unheld mount
            self.registry.commit_created(rec, before_rename=lambda: fault("create.before_commit", delay=0.3))
            fault("create.after_commit", delay=0.3)
        finally:
            os.close(lock_fd)
        self.registry.sync_created(rec.sandbox_id)

    def _upper(self, sandbox_id: str) -> Path:
        """The sandbox's overlay upper layer: its quota'd subvolume, or a dir of its sandbox dir."""
        if self._pool is not None:
            return self._pool.upper(sandbox_id)
        return self.registry.sandbox_dir(sandbox_id) / "upper"

    def _shift_restored(self, rec: SandboxRecord, manifest: dict[str, Any]) -> None:
        """A restored layer's files carry the checkpointed sandbox's host IDs: re-own them to this one's slice
        when it got another (usually it gets the same back: nothing to do)."""
        old = manifest["spec"].get("id_base")
        if old != rec.id_base:
            changed = shift_tree(str(self._upper(rec.sandbox_id)), old, rec.id_base)
            log.info("restored layer re-owned", extra={"sandbox_id": rec.sandbox_id, "entries": changed})

    def _spawn_spec(self, rec: SandboxRecord) -> dict[str, Any]:
        sdir = self.registry.sandbox_dir(rec.sandbox_id)
        env = {"PATH": _SANDBOX_PATH, "HOME": "/root"}
        env.update(rec.env)
        env.setdefault("ADX_SANDBOX_ID", rec.sandbox_id)
        ro_binds = {inside: str(host) for inside, host in self.config.ro_binds.items()}
        if rec.execd is not None:
            env["PYTHONPATH"] = EXECD_MOUNT  # execd removes it from the workload's and commands' environment
            ro_binds[EXECD_MOUNT] = str(self.config.execd_runtime)
        return {
            "sandbox_id": rec.sandbox_id,
            "sandbox_dir": str(sdir),
            # overlayfs lower layers, topmost first (a store image), or the host-derived skeleton and its binds.
            "image_root": self.images.lowerdir_of(rec.image_layers) if rec.image_layers else str(self._image_root),
            "image_binds": [] if rec.image_layers else self._image["binds"],
            "allow_setuid": bool(rec.image_layers),  # store images: sudo works (see _supervisor)
            "init_argv": rec.init_argv,
            "env": env,
            "cwd": rec.cwd,
            "hostname": rec.sandbox_id,
            "network": rec.network,
            "cgroup_parent": self.config.cgroup_parent,
            "resources": rec.resources.model_dump(),
            "run_dir": str(sdir / "run"),
            "ro_binds": ro_binds,
            "upper_dir": str(self._upper(rec.sandbox_id)),
            "work_dir": str(self._pool.workdir(rec.sandbox_id) if self._pool else sdir / "ovlwork"),
            "veth": veth.spec() if (veth := self.veth_pool.veth(rec.sandbox_id, rec.net_index)) else None,
            "log_dir": str(self.logs.group_dir(rec.log_group or rec.sandbox_id)),
            "log_segment_bytes": self.config.logs_segment_bytes,
            "log_max_bytes": self.config.logs_max_bytes,
            "execd_sockets": str(sdir / SOCKETS_DIR) if rec.execd is not None else None,
            "control_dir": str(sdir / CONTROL_DIR) if rec.execd is not None else None,
            "userns": {"base": rec.id_base, "size": IDS_PER_SANDBOX} if rec.id_base is not None else None,
            # PID 1 runs execd in process when it would exec the very interpreter the spawner runs.
            "execd_inproc": rec.execd is not None
            and not rec.image_layers  # a store image's python is its own, not the spawner's
            and self.spawner.execd_python is not None
            and self._resolve_in_image(rec.execd.python, env["PATH"]) == self.spawner.execd_python,
        }

    async def _create_locked(self, rec: SandboxRecord, restore: tuple[Path, dict[str, Any]] | None) -> CreateResponse:
        t0 = time.perf_counter()
        try:
            lock_fd = self.spares.prepare(rec.sandbox_id, execd=rec.execd is not None)
        except FileExistsError:
            self._unreserve(rec)
            raise ConflictError(
                f"sandbox ID {rec.sandbox_id} was used before; IDs are never reused",
                details={"sandbox_id": rec.sandbox_id},
            ) from None
        except OSError as exc:
            self._unreserve(rec)
            raise UnavailableError(f"cannot create sandbox dir: {exc}") from exc
        # The commit (record fsync, then the directory fsyncs) overlaps the start; the supervisor waits for the
        # record on the lifecycle lock. Every outcome waits for the commit (the finally), a reply too.
        committed = asyncio.ensure_future(asyncio.to_thread(self._commit_created, rec, lock_fd))
        try:
            return await self._start_created(rec, restore, committed, t0)
        finally:
            await asyncio.gather(committed, return_exceptions=True)  # a failure has set the storage-failed flag
            self.spares.refill_soon()

    async def _start_created(
        self,
        rec: SandboxRecord,
        restore: tuple[Path, dict[str, Any]] | None,
        committed: asyncio.Future[None],
        t0: float,
    ) -> CreateResponse:
        error: AdxError | None = None
        if rec.execd is not None:
            try:
                # Listen before execd exists: its first connect attempt succeeds, no reconnect backoff.
                await self._register_control(rec.sandbox_id)
            except OSError as exc:
                error = UnavailableError(f"runtime control socket of {rec.sandbox_id}: {exc}")
        snapshot = ckpt.snapshot_of(restore[1]) if restore is not None else None
        if snapshot is not None and self._pool is None:
            error = UnavailableError("the checkpoint is a btrfs snapshot and this sandboxd has no disk_quota pool")
        if self._pool is not None and error is None:
            try:
                if snapshot is not None and restore is not None:
                    # A writable snapshot of the checkpoint: metadata, however many bytes the layer holds.
                    await asyncio.to_thread(self._pool.restore, *snapshot, rec.sandbox_id, rec.resources.disk_bytes)
                    await asyncio.to_thread(self._shift_restored, rec, restore[1])
                    restore = None
                else:
                    await asyncio.to_thread(self._pool.create, rec.sandbox_id, rec.resources.disk_bytes)
            except AdxError as exc:
                error = exc
            except OSError as exc:
                error = UnavailableError(f"writable layer of {rec.sandbox_id}: {exc}")
        if restore is not None and error is None:
            sdir = self.registry.sandbox_dir(rec.sandbox_id)
            artifact, manifest = restore

            def extract() -> None:
                ckpt.verify_and_extract(artifact, manifest, sdir / ".layer", self._upper(rec.sandbox_id))
                self._shift_restored(rec, manifest)
                fault("restore.after_extract", delay=0.3)  # the delay: the overlapping commit lands first

            try:
                await asyncio.to_thread(extract)
            except AdxError as exc:
                error = exc
            except OSError as exc:
                error = UnavailableError(f"restore of {rec.sandbox_id} failed: {exc}")
        if error is None and rec.net_policy is not None and self.netfilter.ready:
            # Before the veth exists: the sandbox's first packet already meets its policy.
            try:
                await asyncio.to_thread(self.netfilter.apply, host_if(rec.sandbox_id), rec.net_policy)
            except AdxError as exc:
                error = exc
        if error is None:
            try:
                t1 = time.perf_counter()
                report = await self.spawner.spawn(self._spawn_spec(rec), self.config.create_timeout_seconds)
                t2 = time.perf_counter()
            except UncertainOutcomeError as exc:
                await committed  # UncertainOutcomeError (storage failed): the record stays, reserved
                await self._set(rec, State.FAILED, reason=f"create outcome unknown: {exc}")
                raise UncertainOutcomeError(
                    f"create of sandbox {rec.sandbox_id} is uncertain ({exc}); it is kept as failed and reserved: "
                    "query or delete this ID, do not resubmit blindly",
                    details={"sandbox_id": rec.sandbox_id},
                ) from exc
            except AdxError as exc:
                error = exc
            else:
                await committed  # UncertainOutcomeError (storage failed): the record stays, reserved
                if report.get("ok"):
                    native = NativeIdentity.model_validate(report["native"])
                    # Published, not persisted: Running is a native observation (SBX-2), and its evidence, the
                    # identity the supervisor recorded before starting, is what a restart adopts
                    # (_settle_creating). A second fsync'd write (~1.4 ms of every create) would add nothing;
                    # the next persisted change of this sandbox writes the whole record.
                    rec = self.records[rec.sandbox_id] = self._transition(
                        rec, State.RUNNING, native=native, reason="started"
                    )
                    log.debug(
                        "create timings",
                        extra={
                            "sandbox_id": rec.sandbox_id,
                            "prepare_ms": round((t1 - t0) * 1000, 2),
                            "spawn_ms": round((t2 - t1) * 1000, 2),
                        },
                    )
                    return CreateResponse(sandbox=self._info(rec), token=rec.token)
                error = UnavailableError(f"sandbox {rec.sandbox_id} failed to start: {report.get('error')}")
        # SBX-13: create failed. Clean up; only a confirmed cleanup removes record and reservation.
        await committed  # UncertainOutcomeError (storage failed): the record stays, reserved
        try:
            await asyncio.to_thread(self._delete_native, rec)
        except AdxError as cleanup_exc:
            await self._set(rec, State.FAILED, reason=f"{error}; cleanup uncertain: {cleanup_exc}")
            raise UncertainOutcomeError(
                f"create of sandbox {rec.sandbox_id} failed and its cleanup is uncertain ({cleanup_exc}); "
                "it is kept as failed and reserved",
                details={"sandbox_id": rec.sandbox_id},
            ) from error
        self._forget(rec, "create failed; cleanup confirmed")
        error.details.setdefault("sandbox_id", rec.sandbox_id)
        raise error

    async def get(self, ref: SandboxRef) -> SandboxInfo:
        rec = self._auth(ref)
        async with self._lock(rec.sandbox_id):
            if self._current(ref) is None:
                raise self._deleted(rec.sandbox_id)
            rec, err = await self._reconcile(rec.sandbox_id)
            return self._info(rec, err)

    async def commit_layer(self, req: CommitLayerRequest) -> CommitLayerResponse:
        """An image build step: the ended sandbox's upper layer becomes store layer ``req.digest`` (moved, not
        copied, when on one filesystem). The sandbox must have exited; it keeps an empty upper layer."""
        rec = self._auth(req.ref)
        async with self._lock(rec.sandbox_id):
            if self._current(req.ref) is None:
                raise self._deleted(rec.sandbox_id)
            rec, _ = await self._reconcile(rec.sandbox_id)
            if rec.state != State.TERMINATED:
                raise ConflictError(
                    f"sandbox {rec.sandbox_id} is {rec.state}; only an ended sandbox's layer can be committed",
                    details={"state": str(rec.state)},
                )
            upper = self._upper(rec.sandbox_id)
            info = await asyncio.to_thread(commit_upper, self.images, upper, req.digest, req.parent, req.step)
            return CommitLayerResponse(digest=info.digest, size_bytes=info.size_bytes)

    async def output(self, ref: SandboxRef) -> OutputResponse:
        """The tail of PID 1's stdout/stderr (a build step's output)."""
        rec = self._auth(ref)
        text, truncated = await asyncio.to_thread(output_tail, self.registry.sandbox_dir(rec.sandbox_id) / OUTPUT_LOG)
        return OutputResponse(output=text, truncated=truncated)

    async def reclaim(self, req: ReclaimRequest) -> ReclaimResponse:
        """Owner-level: give a sandbox a new token (``req.token``) when its holder lost the old one.

        The caller proves ownership as for every call (same-UID peer, checked per connection) and by naming this
        daemon's owner UUID. The new token is persisted (temp + fsync + rename + fsync(dir)) before the reply
        and replaces the old one in memory in the same step: every later call with the old token, and every call
        that authenticated with it and waits for this sandbox's lock, is refused. A retry with the same token
        (its reply lost, even across a SIGKILL) finds it in place and answers again, ``replayed``.
        """
        self.registry.check_usable()
        if req.owner != self.owner:
            raise PermissionDeniedError(
                f"owner: {req.owner} is not this sandboxd's owner", details={"field": "owner", "reason": "mismatch"}
            )
        sandbox_id = req.sandbox_id

        def missing() -> NotFoundError:
            if sandbox_id in self.tombstoned:
                return NotFoundError(
                    f"sandbox_id: sandbox {sandbox_id} was deleted (tombstoned); there is nothing to reclaim",
                    details={"field": "sandbox_id", "tombstone": True},
                )
            return NotFoundError(f"sandbox_id: no sandbox {sandbox_id}", details={"field": "sandbox_id"})

        if sandbox_id not in self.records:
            raise missing()  # before the lock: an unknown ID gets no lock entry
        async with self._lock(sandbox_id):
            rec = self.records.get(sandbox_id)
            if rec is None:
                raise missing()
            if req.generation != rec.generation:
                raise ConflictError(
                    f"generation: sandbox {sandbox_id} is generation {rec.generation}, not {req.generation}",
                    details={"field": "generation", "generation": rec.generation},
                )
            replayed = hmac.compare_digest(req.token.encode(), rec.token.encode())
            if not replayed:
                new = rec.model_copy(update={"token": req.token, "reclaimed_at": time.time()})

                def persist() -> None:
                    self.registry.replace_record(new, before_rename=lambda: fault("reclaim.before_rename"))
                    fault("reclaim.after_persist")

                await asyncio.to_thread(persist)
                self.records[sandbox_id] = new
                log.warning(
                    "sandbox %s: token replaced by its owner (Reclaim); the old token is void",
                    sandbox_id,
                    extra={"sandbox_id": sandbox_id, "generation": rec.generation, "state": str(rec.state)},
                )
            rec, err = await self._reconcile(sandbox_id)
            return ReclaimResponse(sandbox=self._info(rec, err), token=rec.token, replayed=replayed)

    async def list(self) -> ListResponse:
        self.registry.check_usable()
        # SBX-11: list returns the persisted observations; only Get/Wait query the native side.
        return ListResponse(
            sandboxes=[self._info(r) for r in sorted(self.records.values(), key=lambda r: r.created_at)]
        )

    async def delete(self, ref: SandboxRef) -> DeleteResponse:
        rec = self._auth(ref)
        async with self._lock(rec.sandbox_id):
            current = self._current(ref)
            if current is None:
                return DeleteResponse(sandbox_id=rec.sandbox_id, generation=rec.generation, state=State.DELETED)
            await self._delete_locked(current, "delete requested")
            return DeleteResponse(sandbox_id=rec.sandbox_id, generation=rec.generation, state=State.DELETED)

    async def _delete_locked(self, rec: SandboxRecord, reason: str) -> None:
        if rec.state != State.STOPPING:
            rec = await self._set(rec, State.STOPPING, reason=reason)  # the durable intent comes first
        fault("delete.after_intent")
        await self._finish_delete(rec, reason)

    async def wait(self, req: WaitRequest) -> WaitResponse:
        rec = self._auth(req.ref)
        sandbox_id = rec.sandbox_id
        exit_path = self.registry.sandbox_dir(sandbox_id) / EXIT_FILE
        deadline = time.monotonic() + min(req.timeout_seconds, self.config.max_wait_seconds)
        next_full = 0.0
        last = self._info(rec)
        while True:
            now = time.monotonic()
            current = self.records.get(sandbox_id)
            if current is None:
                return WaitResponse(done=True, sandbox=last.model_copy(update={"state": State.DELETED}))
            self._check_token(req.ref, current)  # a Reclaim meanwhile ends the old holder's wait
            # A stat per tick is cheap; the full native query (thread) runs when the exit record appears
            # and once a second to notice vanished cgroups.
            if exit_path.exists() or now >= next_full:
                next_full = now + 1.0
                async with self._lock(sandbox_id):
                    if sandbox_id in self.records:
                        current, _ = await self._reconcile(sandbox_id)
                last = self._info(current)
            if current.state in TERMINAL_FOR_WAIT:
                return WaitResponse(done=True, sandbox=self._info(current))
            if now >= deadline:
                return WaitResponse(done=False, sandbox=last)
            await asyncio.sleep(0.02)

    async def stats(self, ref: SandboxRef) -> Stats:
        rec = self._auth(ref)

        def read() -> Stats:
            cg = self._cgroup(rec.sandbox_id)
            if self._ours(self._native_of(rec), cg) != "ours":
                raise ConflictError(f"sandbox {rec.sandbox_id} has no live cgroup", details={"state": str(rec.state)})
            s = cg.stats()
            return Stats(
                sandbox_id=rec.sandbox_id,
                cpu_usage_ns=s.cpu_usage_ns,
                memory_bytes=s.memory_bytes,
                memory_peak_bytes=s.memory_peak_bytes,
                memory_cache_bytes=s.memory_cache_bytes,
                pids=s.pids,
                oom_kills=s.oom_kills,
                disk_bytes=tree_bytes(self._upper(rec.sandbox_id)),
                observed_at=time.time(),
            )

        return await asyncio.to_thread(read)

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
            cgroups=self.layout.describe(),
            resource_observed_at=observed,
            resource_age_seconds=age,
            resource_fresh=fresh,
            resource_error=self._resource_error,
            state_dir=str(self.config.state_dir),
            deferred_errors=list(self.deferred_errors),
            runtime_control_socket=str(self.config.runtime_control_socket),
            artifact_roots={name: str(path) for name, path in self.config.artifact_roots().items()},
            user_namespace=self._userns,
            user_namespace_note=self._userns_note,
        )

    async def set_network(self, req: SetNetworkRequest) -> SandboxInfo:
        """Replace one running sandbox's egress policy in place: one nft transaction, then the record."""
        rec = self._auth(req.ref)
        async with self._lock(rec.sandbox_id):
            if self._current(req.ref) is None:
                raise self._deleted(rec.sandbox_id)
            rec = self.records[rec.sandbox_id]
            if rec.net_index is None:
                if req.policy.mode is NetworkMode.NONE:
                    return self._info(rec)  # lo only already
                raise ConflictError(
                    f"network.mode: sandbox {rec.sandbox_id} was created without a veth (network "
                    f"{rec.network!r}); egress needs a new sandbox",
                    details={"sandbox_id": rec.sandbox_id},
                )
            if not self.netfilter.ready:
                raise UnavailableError("network policy unavailable: nftables is not set up (is nft installed?)")
            await asyncio.to_thread(self.netfilter.apply, host_if(rec.sandbox_id), req.policy)
            rec = await asyncio.to_thread(self._persist, rec.model_copy(update={"net_policy": req.policy}))
            log.info("network policy replaced", extra={"sandbox_id": rec.sandbox_id, "mode": req.policy.mode.value})
            return self._info(rec)

    async def pause(self, ref: SandboxRef) -> SandboxInfo:
        """Freeze every process of the sandbox (cgroup freezer); state becomes Paused by observation."""
        return await self._freeze(ref, freeze=True)

    async def resume(self, ref: SandboxRef) -> SandboxInfo:
        return await self._freeze(ref, freeze=False)

    async def _freeze(self, ref: SandboxRef, freeze: bool) -> SandboxInfo:
        rec = self._auth(ref)
        async with self._lock(rec.sandbox_id):
            if self._current(ref) is None:
                raise self._deleted(rec.sandbox_id)
            rec, _ = await self._reconcile(rec.sandbox_id)
            if rec.state not in (State.RUNNING, State.PAUSED):  # pausing a paused sandbox is a no-op
                raise ConflictError(
                    f"sandbox {rec.sandbox_id} is {rec.state}; cannot {'pause' if freeze else 'resume'}"
                )

            def act() -> None:
                cg = self._cgroup(rec.sandbox_id)
                if self._ours(rec.native, cg) != "ours":
                    raise ConflictError(f"sandbox {rec.sandbox_id} has no live cgroup")
                if freeze:
                    cg.freeze()
                    fault("pause.after_freeze")
                else:
                    cg.thaw()

            await asyncio.to_thread(act)
            rec, err = await self._reconcile(rec.sandbox_id)
            return self._info(rec, err)

    def _artifact_root(self, storage: str) -> Path:
        roots = self.config.artifact_roots()
        if storage not in roots:
            raise InvalidInputError("storage", f"unknown checkpoint storage {storage!r} (known: {sorted(roots)})")
        return roots[storage]

    async def checkpoint(self, req: CheckpointRequest) -> CheckpointInfo:
        rec = self._auth(req.ref)
        root = self._artifact_root(req.storage)
        async with self._lock(rec.sandbox_id):
            if self._current(req.ref) is None:
                raise self._deleted(rec.sandbox_id)
            rec, _ = await self._reconcile(rec.sandbox_id)
            if rec.state not in (State.RUNNING, State.PAUSED, State.TERMINATED):
                raise ConflictError(f"sandbox {rec.sandbox_id} is {rec.state}; cannot checkpoint")
            checkpoint_id = ckpt.new_checkpoint_id()
            artifact = root / checkpoint_id
            created_at = time.time()
            body: dict[str, Any] = {
                "checkpoint_id": checkpoint_id,
                "created_at": created_at,
                "source": {"sandbox_id": rec.sandbox_id, "generation": rec.generation, "owner": self.owner},
                "spec": {
                    "argv": rec.argv,
                    "init_argv": rec.init_argv,
                    "execd": rec.execd.model_dump(mode="json") if rec.execd else None,
                    "env": rec.env,
                    "cwd": rec.cwd,
                    "network": rec.network,
                    "network_policy": rec.net_policy.to_wire() if rec.net_policy else None,
                    "resources": rec.resources.model_dump(),
                    "metadata": rec.metadata,
                    # The host IDs the layer's files carry (None: no user namespace): a restore shifts them.
                    "id_base": rec.id_base,
                    "image": rec.image,
                    "image_layers": rec.image_layers,
                    "image_user": rec.image_user,
                },
            }

            def run() -> tuple[str, str, int]:
                cg = self._cgroup(rec.sandbox_id)
                live = rec.state == State.RUNNING and self._ours(rec.native, cg) == "ours"
                if live:
                    cg.freeze()  # a consistent upper layer: nothing writes while tar reads
                    fault("checkpoint.after_freeze")
                try:
                    if self._pool is not None and req.storage == "local":
                        # The local root and the pool are this daemon's: a read-only snapshot is the layer.
                        uuid = self._pool.snapshot(rec.sandbox_id, checkpoint_id)
                        try:
                            size = tree_bytes(self._upper(rec.sandbox_id))
                            return ckpt.write_snapshot_artifact(artifact, body, self.owner, checkpoint_id, uuid, size)
                        except BaseException:
                            self._pool.delete_snapshot(checkpoint_id)
                            raise
                    return ckpt.capture_layer(self._upper(rec.sandbox_id), artifact, body, self.owner)
                finally:
                    if live and not req.leave_running:
                        cg.kill()
                    if live:
                        cg.thaw()

            try:
                digest, layer_sha, size = await asyncio.wait_for(
                    asyncio.to_thread(run), self.config.checkpoint_timeout_seconds
                )
            except TimeoutError:
                raise UncertainOutcomeError(f"checkpoint of {rec.sandbox_id} timed out") from None
            return CheckpointInfo(
                checkpoint_id=checkpoint_id,
                kind="filesystem",
                location=str(artifact),
                digest=digest,
                layer_sha256=layer_sha,
                size_bytes=size,
                created_at=created_at,
                source_sandbox_id=rec.sandbox_id,
            )

    async def delete_checkpoint(self, ref: CheckpointRef) -> CheckpointRef:
        """Remove an artifact dir (idempotent) after checking the caller names it by its exact digest."""
        artifact = ckpt.resolve_location(ref.location, self.config.artifact_roots())

        def remove() -> None:
            if not artifact.exists():
                return
            snapshot = ckpt.snapshot_of(ckpt.read_manifest(artifact, ref.digest))
            # Rename first so a crash midway never leaves a half-deleted artifact that still looks whole; a
            # snapshot a crash leaves unreferenced is swept at the next start.
            doomed = ckpt.deleting_dir(artifact)
            os.rename(artifact, doomed)
            if snapshot is not None and self._pool is not None:
                self._pool.delete_snapshot(snapshot[0])
            shutil.rmtree(doomed)

        await asyncio.to_thread(remove)
        return ref

    async def list_checkpoints(self, req: ListCheckpointsRequest) -> ListCheckpointsResponse:
        """The whole artifacts this daemon captured in one storage (a node's startup sweep, NOD-15)."""
        found = await asyncio.to_thread(ckpt.list_artifacts, self._artifact_root(req.storage), self.owner)
        return ListCheckpointsResponse(
            storage=req.storage,
            checkpoints=[
                StoredCheckpoint(
                    checkpoint_id=path.name,
                    location=str(path),
                    digest=digest,
                    size_bytes=int(manifest.get("layer", {}).get("size", 0)),
                    created_at=float(manifest.get("created_at", 0.0)),
                    source_sandbox_id=str(manifest.get("source", {}).get("sandbox_id", "")),
                )
                for path, digest, manifest in found
            ],
        )

    async def restore(self, req: RestoreRequest) -> CreateResponse:
        self.registry.check_usable()
        artifact = ckpt.resolve_location(req.location, self.config.artifact_roots())
        manifest = await asyncio.to_thread(ckpt.read_manifest, artifact, req.digest)  # digest first
        spec = manifest["spec"]
        execd = req.execd or (ExecdOptions.model_validate(spec["execd"]) if spec.get("execd") else None)
        plain_init = req.init_argv or (spec["init_argv"] if not req.argv else None)
        create = CreateRequest(
            request_id=req.request_id,
            sandbox_id=req.sandbox_id,
            generation=req.generation,
            token=req.token,
            argv=req.argv or spec["argv"],
            # An execd sandbox's init is rebuilt for the new ID (the stored one names the old sandbox).
            init_argv=None if execd is not None else plain_init,
            execd=execd,
            env=req.env if req.env is not None else spec["env"],
            cwd=spec["cwd"],
            resources=req.resources or spec["resources"],
            metadata=req.metadata if req.metadata is not None else spec["metadata"],
            ttl_seconds=req.ttl_seconds,
            network=spec["network"],
            # The Environment's current policy (it may have changed while paused), else the checkpointed one.
            network_policy=req.network_policy
            or (NetworkPolicy.model_validate(spec["network_policy"]) if spec.get("network_policy") else None),
            log_group=req.log_group,
        )
        return await self.create(create, restore=(artifact, manifest))

    # == maintenance ================================================================================
    async def maintenance(self) -> None:
        """Retry pending deletes and reclaims, delete expired sandboxes, keep resource data fresh."""
        last_resource = time.monotonic()
        while True:
            await asyncio.sleep(self.config.maintenance_interval_seconds)
            if self.registry.storage_failed is not None:
                continue
            now = time.time()
            for rec in list(self.records.values()):
                expired = rec.expires_at is not None and rec.expires_at <= now
                if rec.state != State.STOPPING and not expired:
                    continue
                lock = self._lock(rec.sandbox_id)
                if lock.locked():
                    continue
                async with lock:
                    current = self.records.get(rec.sandbox_id)
                    if current is None:
                        continue
                    try:
                        await self._delete_locked(current, "ttl expired" if expired else "retrying delete intent")
                    except AdxError as exc:
                        self._defer(f"delete of {rec.sandbox_id}: {exc}")
            for sandbox_id in list(self.pending_reclaim):
                lock = self._lock(sandbox_id)
                if lock.locked():
                    continue  # a delete is reclaiming it right now
                async with lock:
                    if sandbox_id in self.pending_reclaim:
                        await asyncio.to_thread(self._try_reclaim, sandbox_id)
            if time.monotonic() - last_resource >= self.config.resource_refresh_seconds:
                last_resource = time.monotonic()
                # A failed refresh must not end maintenance: health reports it and freshness runs out.
                with contextlib.suppress(UnavailableError):
                    await asyncio.to_thread(self._refresh_resource)
