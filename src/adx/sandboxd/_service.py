"""sandboxd's service: the sandbox API assembled from its layers, the calls that change a live sandbox in place
(Reclaim, SetNetwork, Pause, Resume) and maintenance (retried deletes and reclaims, expiry, resource data).

Blocking work (fsync'd registry writes, cgroup I/O, tar) runs in worker threads via ``asyncio.to_thread``;
the event loop itself only does bookkeeping. Per-sandbox operations are serialised by a per-sandbox
``asyncio.Lock``; the cross-process exclusion with the supervisor is its ``lifecycle.lock`` flock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time

from adx.errors import AdxError, ConflictError, NotFoundError, UnavailableError
from adx.model import NetworkMode
from adx.sandboxd._checkpointing import Checkpointing
from adx.sandboxd._errors import PermissionDeniedError
from adx.sandboxd._faults import fault
from adx.sandboxd._models import ReclaimRequest, ReclaimResponse, SandboxInfo, SandboxRef, SetNetworkRequest
from adx.sandboxd._states import State
from adx.sandboxd._veth import host_if_of

__all__ = ["SandboxService"]

log = logging.getLogger("adx.sandboxd")


class SandboxService(Checkpointing):
    """sandboxd's API, each part in a module of its own, one layer on the other: ``_table`` (records and
    transitions), ``_control_sockets``, ``_preflight``, ``_observe`` (reads), ``_delete``, ``_reconcile``
    (startup), ``_create``, ``_checkpointing``; here the rest of the API and maintenance."""

    async def attach(self) -> None:
        self._alloc_lock = asyncio.Lock()
        await self.spawner.attach()

    async def close(self) -> None:
        if self.hub is not None:
            await self.hub.stop()
        await self.spawner.close()
        try:
            # The brief's rule: the table lives as long as the daemon; a restart re-installs every policy.
            await asyncio.to_thread(self.netfilter.teardown)
        except AdxError as exc:
            log.warning("nftables table not removed: %s", exc)

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
            await asyncio.to_thread(self.netfilter.apply, host_if_of(rec.sandbox_id, rec.native_name), req.policy)
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

    async def maintenance(self) -> None:
        """Retry pending deletes and reclaims, delete expired sandboxes, keep resource data fresh."""
        last_resource = time.monotonic()
        while True:
            await asyncio.sleep(self.config.maintenance_interval_seconds)
            if self.registry.storage_failed is not None:
                continue
            self.refill_warm_soon(after_create=False)  # deletes free room for members too
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
