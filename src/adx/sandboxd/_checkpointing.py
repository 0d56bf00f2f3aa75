"""A sandbox's writable layer captured (a checkpoint artifact, or a store layer for an image build) and
restored into a new sandbox."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from adx.errors import ConflictError, InvalidInputError, UncertainOutcomeError
from adx.model import NetworkPolicy
from adx.sandboxd import _checkpoint as ckpt
from adx.sandboxd._faults import fault
from adx.sandboxd._host_resources import tree_bytes
from adx.sandboxd._layers import commit_upper
from adx.sandboxd._models import (
    CheckpointInfo,
    CheckpointRef,
    CheckpointRequest,
    CommitLayerRequest,
    CommitLayerResponse,
    CreateRequest,
    CreateResponse,
    ExecdOptions,
    ListCheckpointsRequest,
    ListCheckpointsResponse,
    ResourcesSpec,
    RestoreRequest,
    StoredCheckpoint,
)
from adx.sandboxd._states import State
from adx.sandboxd._userns import shift_tree
from adx.sandboxd._warm_create import WarmSandboxes

__all__ = ["Checkpointing"]


class Checkpointing(WarmSandboxes):
    """Checkpoint, restore, and the artifacts of one storage; commit of a layer to the image store."""

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
            body: ckpt.ManifestBody = {
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
                        snap = self._pool.snapshot(rec.sandbox_id, checkpoint_id)
                        try:
                            # A crash from here until the artifact's rename leaves a snapshot no whole artifact
                            # names: the next start deletes it (Preflight), so it is never taken as a checkpoint.
                            fault("checkpoint.after_snapshot")
                            size = snap.size_bytes
                            if size is None:
                                size = tree_bytes(self._pool.snapshot_path(checkpoint_id) / "upper")
                            return ckpt.write_snapshot_artifact(
                                artifact, body, self.owner, checkpoint_id, snap.uuid, size
                            )
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
            resources=req.resources or ResourcesSpec.model_validate(spec["resources"]),
            metadata=req.metadata if req.metadata is not None else spec["metadata"],
            ttl_seconds=req.ttl_seconds,
            network=spec["network"],
            # The Environment's current policy (it may have changed while paused), else the checkpointed one.
            network_policy=req.network_policy
            or (NetworkPolicy.model_validate(spec["network_policy"]) if spec.get("network_policy") else None),
            log_group=req.log_group,
            volumes=req.volumes,
        )
        return await self.create(create, restore=(artifact, manifest))

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
            # The upper layer holds this sandbox's host IDs (its user-namespace slice); a store layer holds the
            # IDs as they are inside, which every later sandbox's idmapped mount maps to its own slice.
            await asyncio.to_thread(shift_tree, str(upper), rec.id_base, None)
            info = await asyncio.to_thread(commit_upper, self.images, upper, req.digest, req.parent, req.step)
            return CommitLayerResponse(digest=info.digest, size_bytes=info.size_bytes)
