"""Delete (SBX-7, SBX-12): the durable intent, the kill by identity-bound cgroup, the proof of emptiness under
the lifecycle lock, the tombstone, and the reclaim of what the sandbox held (retried until it succeeds)."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time

from adx.errors import AdxError, UnavailableError
from adx.sandboxd._faults import fault
from adx.sandboxd._models import DeleteResponse, SandboxRecord, SandboxRef
from adx.sandboxd._observe import SandboxObserver
from adx.sandboxd._registry import TombstoneExtra
from adx.sandboxd._sandbox_layout import LOCK_FILE
from adx.sandboxd._states import State
from adx.sandboxd._veth import host_if_of

__all__ = ["SandboxDeleter"]

log = logging.getLogger("adx.sandboxd")


class SandboxDeleter(SandboxObserver):
    """Deleting sandboxes and reclaiming tombstoned ones."""

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
                self.netfilter.remove(
                    host_if_of(rec.sandbox_id, rec.native_name)
                )  # the veth died with the namespace; now its rules
            data: TombstoneExtra = {
                "cgroup": where,
                "reason": "deleted",
                "id_base": rec.id_base,
                "native_name": rec.native_name,
            }
            tomb = self.registry.write_tombstone(rec, data)
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
