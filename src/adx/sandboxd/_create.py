"""Create (SBX-1, SBX-13): admission and reservation, the sandbox's image and identity ranges, its directory
and record commit overlapping the supervisor's start, and a confirmed cleanup of a failed create."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any, NoReturn

from adx.errors import AdxError, ConflictError, InvalidInputError, UnavailableError, UncertainOutcomeError
from adx.images import ImageManifest
from adx.model import NetworkMode, NetworkPolicy
from adx.sandboxd import _checkpoint as ckpt
from adx.sandboxd._checkpoint import Manifest
from adx.sandboxd._faults import fault
from adx.sandboxd._layers import ensure_mountpoints
from adx.sandboxd._models import CreateRequest, CreateResponse, NativeIdentity, Resources, SandboxRecord
from adx.sandboxd._preflight import SANDBOX_PATH
from adx.sandboxd._reconcile import StartupReconcile
from adx.sandboxd._sandbox_layout import (
    CONTROL_DIR,
    EXECD_MOUNT,
    SOCKETS_DIR,
)
from adx.sandboxd._spawn_spec import Limits, SpawnReport, SpawnSpec, UserNamespace
from adx.sandboxd._states import State
from adx.sandboxd._userns import IDS_PER_SANDBOX, shift_tree
from adx.sandboxd._userns import allocate as allocate_ids
from adx.sandboxd._veth import host_if_of
from adx.sandboxd._warm_pool import WarmKey, WarmMember

__all__ = ["SandboxCreator"]

log = logging.getLogger("adx.sandboxd")


class SandboxCreator(StartupReconcile):
    """The create pipeline (a restore is a create with a checkpoint's layer)."""

    async def create(self, req: CreateRequest, restore: tuple[Path, Manifest] | None = None) -> CreateResponse:
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

    def _layer_limit(self, disk_bytes: int) -> int:
        """The quota of a writable layer (disk_quota on): the sandbox's disk, or for one that reserved none (an
        Environment that asked no disk: RES-6) the defaults' disk, as a limit only (it reserves nothing)."""
        return disk_bytes or self.config.defaults.disk_bytes

    def _reserve(self, req: CreateRequest, digest: str, restore: tuple[Path, Manifest] | None) -> SandboxRecord:
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
        # A create (not a restore) of a kept shape claims a warm member: its IDs, /30 and names. Not one that
        # mounts volumes: a member's mounts were made before anyone asked for them (volume binds go cold).
        key = WarmKey.of(req.image, layers, user, res, network, req.execd.python if req.execd else None)
        member = self.warm.take(key, alive=self._member_alive) if restore is None and not req.volumes else None
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
            init_argv=req.execd.init_argv(sandbox_id, req.argv, user) if req.execd else (req.init_argv or req.argv),
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
            net_index=member.net_index if member else self._allocate_net_index() if network == "veth" else None,
            native_name=member.member_id if member else None,
            id_base=member.id_base
            if member
            else self._allocate_ids(restore[1]["spec"].get("id_base") if restore else None),
            image=req.image,
            image_layers=layers,
            image_user=user,
            volumes=req.volumes,
        )
        self.records[sandbox_id] = rec  # reserved from here on
        self.by_request[req.request_id] = sandbox_id
        if member is not None:
            self.warm.claiming[sandbox_id] = member
        return rec

    def _resolve_image(
        self, req: CreateRequest, restore: tuple[Path, Manifest] | None
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

    def _allocate_ids(self, prefer: int | None) -> int | None:
        """The new sandbox's slice of ``id_range`` (None without user namespaces). Taken: every record's, and a
        deleted sandbox's until its reclaim is done (a process of it may live on until then)."""
        if not self._userns:
            return None
        used = {r.id_base for r in self.records.values() if r.id_base is not None} | self.warm.used_id_bases()
        used |= {int(i) for t in self.pending_reclaim.values() if (i := t.data.get("id_base")) is not None}
        return allocate_ids(used, self.config.id_range.start, self.config.id_range.count, prefer)

    def _allocate_net_index(self) -> int:
        """The next free /30: not a record's, not a warm member's."""
        used = {r.net_index for r in self.records.values() if r.net_index is not None}
        return self.veth_pool.allocate(used | self.warm.used_net_indexes())

    def _unreserve(self, rec: SandboxRecord) -> None:
        self.records.pop(rec.sandbox_id, None)
        self.warm.claiming.pop(rec.sandbox_id, None)
        if self.by_request.get(rec.request_id) == rec.sandbox_id:
            del self.by_request[rec.request_id]

    def _commit_created(self, rec: SandboxRecord, lock_fd: int, held_by: str | None = None) -> None:
        """Commit point: the record (temp, fsync, rename), then the lifecycle lock is released (the supervisor,
        which checks the record under that lock, may start), then the directory fsyncs (awaited before any
        reply): the ID survives a crash. Raises UncertainOutcomeError when storage failed (the flag is set).
        ``held_by``: a claimed warm member, whose hold on the very layers becomes the sandbox's (one fsync on
        the claim's path where a new hold takes two)."""
        try:
            # The layers' hold, durable before the record: never a committed sandbox whose mount is unheld.
            if rec.image_layers and not (held_by and self.images.move_hold(held_by, rec.sandbox_id)):
                self.images.hold(rec.sandbox_id, rec.image_layers)
            self.registry.commit_created(rec, before_rename=lambda: fault("create.before_commit", delay=0.3))
            fault("create.after_commit", delay=0.3)
        finally:
            os.close(lock_fd)
        self.registry.sync_created(rec.sandbox_id)

    def _shift_restored(self, rec: SandboxRecord, manifest: Manifest) -> None:
        """A restored layer's files carry the checkpointed sandbox's host IDs: re-own them to this one's slice
        when it got another (usually it gets the same back: nothing to do)."""
        old = manifest["spec"].get("id_base")
        if old != rec.id_base:
            changed = shift_tree(str(self._upper(rec.sandbox_id)), old, rec.id_base)
            log.info("restored layer re-owned", extra={"sandbox_id": rec.sandbox_id, "entries": changed})

    def _spawn_spec(self, rec: SandboxRecord, sdir: Path | None = None) -> SpawnSpec:
        """``sdir``: a warm member's dir (default: the sandbox ID's)."""
        sdir = sdir or self.registry.sandbox_dir(rec.sandbox_id)
        env = {"PATH": SANDBOX_PATH, "HOME": "/root"}
        env.update(rec.env)
        env.setdefault("ADX_SANDBOX_ID", rec.sandbox_id)
        ro_binds = {inside: str(host) for inside, host in self.config.ro_binds.items()}
        if rec.execd is not None:
            env["PYTHONPATH"] = EXECD_MOUNT  # execd removes it from the workload's and commands' environment
            ro_binds[EXECD_MOUNT] = str(self.config.execd_runtime)
        res = rec.resources
        return SpawnSpec(
            sandbox_id=rec.sandbox_id,
            sandbox_dir=str(sdir),
            # overlayfs lower layers, topmost first (a store image), or the host-derived skeleton and its binds.
            image_root=self.images.lowerdir_of(rec.image_layers) if rec.image_layers else str(self._image_root),
            image_binds=[] if rec.image_layers else list(self.skeleton_binds),
            allow_setuid=bool(rec.image_layers),  # store images: sudo works (see _in_namespace)
            init_argv=rec.init_argv,
            env=env,
            cwd=rec.cwd,
            hostname=rec.sandbox_id,
            network=rec.network,
            cgroup_parent=self.config.cgroup_parent,
            resources=Limits(res.cpu_millis, res.memory_bytes, res.pids_max, res.disk_bytes),
            run_dir=str(sdir / "run"),
            ro_binds=ro_binds,
            volume_binds=rec.volumes,
            upper_dir=str(self._pool.upper(rec.sandbox_id) if self._pool else sdir / "upper"),
            work_dir=str(self._pool.workdir(rec.sandbox_id) if self._pool else sdir / "ovlwork"),
            veth=self.veth_pool.veth(rec.sandbox_id, rec.net_index, rec.native_name),
            log_dir=str(self.logs.group_dir(rec.log_group or rec.sandbox_id)),
            log_segment_bytes=self.config.logs_segment_bytes,
            log_max_bytes=self.config.logs_max_bytes,
            execd_sockets=str(sdir / SOCKETS_DIR) if rec.execd is not None else None,
            # Only execd reports Ready (what ends the boost early); any other init would run it out unlimited.
            cpu_boost_seconds=self.config.cpu_boost_seconds if rec.execd is not None else 0.0,
            control_dir=str(sdir / CONTROL_DIR) if rec.execd is not None else None,
            userns=UserNamespace(rec.id_base, IDS_PER_SANDBOX) if rec.id_base is not None else None,
            # PID 1 runs execd in process when it would exec the very interpreter the spawner runs.
            execd_inproc=rec.execd is not None
            and not rec.image_layers  # a store image's python is its own, not the spawner's
            and self.spawner.execd_python is not None
            and self._resolve_in_image(rec.execd.python, env["PATH"]) == self.spawner.execd_python,
        )

    def _started(
        self, rec: SandboxRecord, report: SpawnReport, event: str, level: int, **fields: Any
    ) -> CreateResponse:
        """The supervisor's start report (a cold start's or a claim's): the record becomes Running with the native
        identity the supervisor recorded, ``event`` is logged with ``fields``, and the create's reply returned;
        UnavailableError with the supervisor's reason when it did not start.

        Published, not persisted: Running is a native observation (SBX-2), and its evidence, the identity the
        supervisor recorded before starting, is what a restart adopts (_settle_creating). A second fsync'd write
        (~1.4 ms of every create) would add nothing; the next persisted change of the sandbox writes it all."""
        if not report.get("ok"):
            raise UnavailableError(f"sandbox {rec.sandbox_id} failed to start: {report.get('error')}")
        native = NativeIdentity.model_validate(report["native"])
        rec = self.records[rec.sandbox_id] = self._transition(rec, State.RUNNING, native=native, reason="started")
        log.log(level, event, extra={"sandbox_id": rec.sandbox_id, **fields})
        return CreateResponse(sandbox=self._info(rec), token=rec.token)

    async def _start_claimed(self, rec: SandboxRecord, member: WarmMember) -> CreateResponse:
        """The claim of a warm member (``_warm_create``)."""
        raise NotImplementedError

    def _member_alive(self, member: WarmMember) -> bool:
        """Whether a warm member's processes are all there (``_warm_create``)."""
        raise NotImplementedError

    async def _create_locked(self, rec: SandboxRecord, restore: tuple[Path, Manifest] | None) -> CreateResponse:
        member = self.warm.claiming.get(rec.sandbox_id)
        if member is not None:
            return await self._start_claimed(rec, member)
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
            self.refill_warm_soon()

    def refill_warm_soon(self, after_create: bool = True) -> None:
        """The warm pool's refill (``_warm_create``)."""

    async def _keep_failed(
        self, rec: SandboxRecord, reason: str, what: str, advice: str, cause: BaseException | None
    ) -> NoReturn:
        """A create whose outcome is unknown: its record is persisted failed and stays reserved (SBX-13)."""
        await self._set(rec, State.FAILED, reason=reason)
        raise UncertainOutcomeError(
            f"create of sandbox {rec.sandbox_id} {what}; it is kept as failed and reserved{advice}",
            details={"sandbox_id": rec.sandbox_id},
        ) from cause

    def _apply_policy_soon(self, rec: SandboxRecord, phases: dict[str, float]) -> asyncio.Future[None] | None:
        """The sandbox's egress chain, in a worker thread beside the writable layer's (independent steps: the
        create waits for the longer, not for both). Awaited before the spawn: the veth, made by the supervisor
        only after that, meets its policy from its first packet. A create that fails after the chain was made
        removes it with the rest (``_delete_native``: by the record's ``net_index``)."""
        if rec.net_policy is None or not self.netfilter.ready:
            return None
        host, policy = host_if_of(rec.sandbox_id, rec.native_name), rec.net_policy

        def apply() -> None:
            tp = time.perf_counter()
            self.netfilter.apply(host, policy)
            phases["policy_ms"] = round((time.perf_counter() - tp) * 1000, 2)

        return asyncio.ensure_future(asyncio.to_thread(apply))

    async def _start_created(
        self,
        rec: SandboxRecord,
        restore: tuple[Path, Manifest] | None,
        committed: asyncio.Future[None],
        t0: float,
    ) -> CreateResponse:
        error: AdxError | None = None
        phases: dict[str, float] = {}  # the debug log's per-phase milliseconds (docs/performance.md)
        if rec.execd is not None:
            try:
                # Listen before execd exists: its first connect attempt succeeds, no reconnect backoff.
                await self._register_control(rec.sandbox_id)
            except OSError as exc:
                error = UnavailableError(f"runtime control socket of {rec.sandbox_id}: {exc}")
        policy = self._apply_policy_soon(rec, phases) if error is None else None
        snapshot = ckpt.snapshot_of(restore[1]) if restore is not None else None
        if snapshot is not None and self._pool is None:
            error = UnavailableError("the checkpoint is a btrfs snapshot and this sandboxd has no disk_quota pool")
        if self._pool is not None and error is None:
            try:
                if snapshot is not None and restore is not None:
                    pool, manifest = self._pool, restore[1]

                    def from_snapshot() -> None:
                        # A writable snapshot of the checkpoint: metadata, however many bytes the layer holds.
                        pool.restore(*snapshot, rec.sandbox_id, self._layer_limit(rec.resources.disk_bytes))
                        self._shift_restored(rec, manifest)
                        fault("restore.after_extract", delay=0.3)  # as the tar path's: the layer is in place

                    await asyncio.to_thread(from_snapshot)
                    restore = None
                else:
                    tl = time.perf_counter()
                    await asyncio.to_thread(
                        self._pool.create, rec.sandbox_id, self._layer_limit(rec.resources.disk_bytes)
                    )
                    phases["layer_ms"] = round((time.perf_counter() - tl) * 1000, 2)
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
        if policy is not None:
            try:
                await policy
            except AdxError as exc:
                error = error or exc
        if error is None:
            try:
                t1 = time.perf_counter()
                report = await self.spawner.spawn(self._spawn_spec(rec), self.config.create_timeout_seconds)
                t2 = time.perf_counter()
            except UncertainOutcomeError as exc:
                await committed  # UncertainOutcomeError (storage failed): the record stays, reserved
                await self._keep_failed(
                    rec,
                    f"create outcome unknown: {exc}",
                    f"is uncertain ({exc})",
                    ": query or delete this ID, do not resubmit blindly",
                    exc,
                )
            except AdxError as exc:
                error = exc
            else:
                await committed  # UncertainOutcomeError (storage failed): the record stays, reserved
                try:
                    ms = {"prepare_ms": round((t1 - t0) * 1000, 2), "spawn_ms": round((t2 - t1) * 1000, 2)}
                    # The supervisor's steps, each the ms from its spec's arrival to the step's end.
                    ms.update({f"sup_{k}_ms": v for k, v in report.get("phases", {}).items()})
                    return self._started(rec, report, "create timings", logging.DEBUG, **ms, **phases)
                except UnavailableError as exc:
                    error = exc
        # SBX-13: create failed. Clean up; only a confirmed cleanup removes record and reservation.
        await committed  # UncertainOutcomeError (storage failed): the record stays, reserved
        try:
            await asyncio.to_thread(self._delete_native, rec)
        except AdxError as cleanup_exc:
            await self._keep_failed(
                rec,
                f"{error}; cleanup uncertain: {cleanup_exc}",
                f"failed and its cleanup is uncertain ({cleanup_exc})",
                "",
                error,
            )
        self._forget(rec, "create failed; cleanup confirmed")
        error.details.setdefault("sandbox_id", rec.sandbox_id)
        raise error
