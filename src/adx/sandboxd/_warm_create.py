"""Warm pool, daemon side (issue 16): start members ahead of any create, claim one for a matching create,
refill in the background, destroy what is no longer wanted. Bookkeeping: ``_warm_pool``.

A claim, under the new sandbox's lock (its record is reserved, with the member's ID range and /30):
1. the egress policy, when it differs from the one the member's chain holds (before anything can run);
2. the member's dir is renamed to the sandbox's (the claim point: before it a crash leaves a member, which a
   restart removes; after it an uncommitted ID, which a restart tombstones and reclaims like any);
3. the cgroup and the writable layer are renamed to the sandbox ID (the veth and its chain keep the member's
   name: ``SandboxRecord.native_name``), so delete, reclaim, pause, checkpoint and metrics find them by ID;
4. the spec (ID, environment, argv, cwd, log group) goes to the parked supervisor on ``CLAIM_SOCKET`` *before*
   the record commit releases the lifecycle lock: the supervisor then checks the committed record like any start,
   writes the native identity, and lets the init exec; its start report comes back on the same connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import shutil
import socket
import time
from dataclasses import replace
from pathlib import Path

from adx._backoff import Backoff
from adx._fs import ShortUnixPath
from adx.errors import AdxError, ConflictError, UnavailableError
from adx.model import NetworkMode, NetworkPolicy
from adx.sandboxd._create import SandboxCreator
from adx.sandboxd._faults import fault
from adx.sandboxd._models import CreateRequest, CreateResponse, ExecdOptions, Resources, SandboxRecord
from adx.sandboxd._sandbox_layout import CLAIM_SOCKET, SUPERVISOR_LOG
from adx.sandboxd._spawn_spec import SpawnReport
from adx.sandboxd._states import State
from adx.sandboxd._veth import host_if
from adx.sandboxd._warm_pool import WarmKey, WarmMember, WarmPool

__all__ = ["WarmSandboxes"]

log = logging.getLogger("adx.sandboxd")


def _connect(path: Path) -> socket.socket:
    """Connect (through the dir's ``O_PATH`` descriptor when the path is long: no 108-byte limit). A listening
    Unix socket accepts into its backlog at once: no wait on the loop."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with ShortUnixPath(path) as name:
            sock.connect(name)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-600:].strip() or "(nothing logged)"
    except OSError:
        return "(no log)"


class WarmSandboxes(SandboxCreator):
    _warm_task: asyncio.Task[None] | None = None
    _warm_paused_until = 0.0

    # -- which shapes ------------------------------------------------------------------------------------------
    def pin_default_shape(self) -> None:
        """The defaults' shape is kept warm from the start (when its image resolves now: a Debian base still
        building is learned by the first create instead)."""
        d = self.config.defaults
        try:
            layers, _, user = self._resolve_image(CreateRequest(request_id="warm-pool", argv=["true"]), None)
        except AdxError as exc:
            log.info("warm pool: the default shape is not kept warm yet: %s", exc)
            return
        res = Resources(
            cpu_millis=d.cpu_millis, memory_bytes=d.memory_bytes, pids_max=d.pids_max, disk_bytes=d.disk_bytes
        )
        network = "veth" if d.network_policy is not None and d.network_policy.mode is NetworkMode.EGRESS else d.network
        self.warm.pinned = WarmKey.of(None, layers, user, res, network)

    def _fits(self, key: WarmKey | None = None) -> bool:
        """Members reserve nothing (placement sees only sandboxes), but all of them together (and ``key``'s
        next one) must fit in what the node has left, as if each were one more sandbox: a claim then never
        meets a full node, and a node never holds more members than it could run."""
        reserved = self._reserved()
        every = [m.key for m in self.warm.all_members()] + ([key] if key is not None else [])
        count = len(self.records) + len(self.pending_reclaim) + len(every)
        return (
            sum(k.memory_bytes for k in every) <= self.capacity.memory_bytes - reserved.memory_bytes
            and sum(k.disk_bytes for k in every) <= self.capacity.disk_bytes - reserved.disk_bytes
            and count <= self.config.capacity.max_sandboxes
        )

    # -- refill ------------------------------------------------------------------------------------------------
    def refill_warm_soon(self, after_create: bool = True) -> None:
        """After a create, and on each maintenance tick (a delete frees room; not for 30 s after a refill gave up
        on failures)."""
        dead = self.warm.cull(self._member_alive)  # every tick: a member may die idle, with no create to see it
        if dead:
            log.warning("warm pool: %d member(s) found dead (supervisor or init exited): destroyed, replaced", dead)
        elif not after_create and time.monotonic() < self._warm_paused_until:
            return
        if self.warm.size and (self._warm_task is None or self._warm_task.done()):
            self._warm_task = asyncio.create_task(self._refill_warm(), name="warm-pool")

    async def _refill_warm(self) -> None:
        """One member at a time, after the creates that triggered it (never on a create's path). A member that
        fails to start is retried with backoff, three times in a row at most (then at the next create)."""
        for member in list(self.warm.dead):  # its IDs and /30 stay taken until it is gone
            self.warm.dropped += 1
            await asyncio.to_thread(self._destroy_member, member)
            self.warm.dead.remove(member)
        drop = self.warm.surplus()
        while not self._fits():
            popped = self._pop_any()
            if not popped:
                break
            drop += popped
        for member in drop:
            self.warm.dropped += 1
            await asyncio.to_thread(self._destroy_member, member)
        backoff, failures = Backoff(0.1, 2.0), 0
        while failures < 3:
            wanted = self.warm.next_wanted()
            if wanted is None or not self._fits(wanted):
                return
            if await self._make_member(wanted):
                backoff.reset()
                failures = 0
            else:
                failures += 1
                await asyncio.sleep(backoff.next())
        self._warm_paused_until = time.monotonic() + 30

    def _pop_any(self) -> list[WarmMember]:
        for key in reversed(self.warm.kept()):  # the least wanted shape gives first
            ready = self.warm.members.get(key)
            if ready:
                return [ready.pop()]
        return []

    def _default_policy(self, key: WarmKey) -> NetworkPolicy | None:
        if key.network != "veth":
            return None
        return self.config.defaults.network_policy or NetworkPolicy(mode=NetworkMode.EGRESS)

    async def _make_member(self, key: WarmKey) -> bool:
        member_id, dir_name = WarmPool.new_ids()
        # IDs and /30 taken synchronously (no await before the member is listed): no create can take them too.
        id_base = self._allocate_ids(None)
        net_index = self._allocate_net_index() if key.network == "veth" else None
        policy = self._default_policy(key)
        path = self.registry.sandboxes_dir / dir_name
        member = WarmMember(member_id, key, path, -1, id_base, net_index, policy)
        self.warm.making[member_id] = member
        try:
            member.dir, member.lock_fd = await asyncio.to_thread(
                self.spares.make_named, dir_name, key.execd_python is not None
            )
            if self._pool is not None:
                await asyncio.to_thread(self._pool.create, member_id, self._layer_limit(key.disk_bytes))
            if key.image_layers:
                await asyncio.to_thread(self.images.hold, member_id, list(key.image_layers))
            if policy is not None and self.netfilter.ready:
                await asyncio.to_thread(self.netfilter.apply, host_if(member_id), policy)
            env = await asyncio.to_thread(self._image_env, key)
            spec = replace(self._spawn_spec(self._member_record(member, env), member.dir), warm=True)
            report = await self.spawner.spawn(spec, self.config.create_timeout_seconds)
            if not report.get("ok"):
                raise UnavailableError(f"the warm member did not start: {report.get('error')}")
            for pid in report.get("pids", []):  # ProcessLookupError: one died as it got ready
                member.pidfds += (os.pidfd_open(pid),)
            await asyncio.to_thread(fault, "warm.member_started", 1.0)  # parked, not yet listed
        except (AdxError, OSError) as exc:
            self.warm.making.pop(member_id, None)
            self.warm.failed += 1
            log.warning(
                "warm pool: a member failed to start (retried): %s; supervisor: %s",
                exc,
                _tail(member.dir / SUPERVISOR_LOG),
            )
            await asyncio.to_thread(self._destroy_member, member)
            return False
        self.warm.making.pop(member_id, None)
        self.warm.members.setdefault(key, []).append(member)
        self.warm.made += 1
        log.debug("warm pool: member ready", extra={"member": member_id})
        return True

    def _member_alive(self, member: WarmMember) -> bool:
        """Both its supervisor and its init are there (a pidfd polls readable once its process exited): a member
        whose supervisor died would take its claim's create down with it. Microseconds, on the loop."""
        if not member.pidfds:
            return True  # not ready yet (a making member is not claimable anyway)
        poller = select.poll()
        for fd in member.pidfds:
            poller.register(fd, select.POLLIN)
        return not poller.poll(0)

    def _image_env(self, key: WarmKey) -> dict[str, str]:
        """The environment the shape's image gives a create that asks for none (its manifest's, while the name
        still means these layers): what a member's execd interpreter starts with when it is pre-started
        (``SpawnSpec.prestarts_execd``), so a claim without start-up variables of its own finds it equal."""
        if key.image_layers is None:
            return {}
        manifest = self.images.find(key.image or "base")
        if manifest is None or key.image_layers[-len(manifest.layers) :] != tuple(manifest.layers):
            return {}  # (the key's layers start with sandboxd's mount-point layer: ``_resolve_image``)
        return dict(manifest.env)

    def _member_record(self, member: WarmMember, env: dict[str, str]) -> SandboxRecord:
        """What ``_spawn_spec`` reads, for a member: the shape's parts and its image's ``env``; the rest is the
        claim's."""
        key, now = member.key, time.time()
        execd = ExecdOptions(python=key.execd_python) if key.execd_python else None
        return SandboxRecord(
            sandbox_id=member.member_id,
            generation=1,
            token="-",
            state=State.CREATING,
            request_id=member.member_id,
            request_digest="-",
            argv=[],
            init_argv=execd.init_argv(member.member_id, [], key.image_user) if execd else ["/bin/true"],
            execd=execd,
            env=env,
            cwd="/",
            network=key.network,  # type: ignore[arg-type]  # a WarmKey's network came from a record's
            resources=key.resources,
            metadata={},
            created_at=now,
            updated_at=now,
            net_index=member.net_index,
            id_base=member.id_base,
            image=key.image,
            image_layers=list(key.image_layers) if key.image_layers else None,
            image_user=key.image_user,
        )

    def _destroy_member(self, member: WarmMember, names: tuple[str, ...] = ()) -> None:
        """Kill a member (or what a failed claim left under the member's names), remove what it had. Thread."""
        for name in (member.member_id, *names):
            cg = self._cgroup(name)
            try:
                if cg.exists():
                    cg.kill()
                    cg.wait_empty(self.config.delete_timeout_seconds)
            except OSError as exc:
                self._defer(f"warm member {name}: killing its cgroup failed: {exc}")
        if member.lock_fd >= 0:
            os.close(member.lock_fd)  # the parked supervisor finds no claim and exits
            member.lock_fd = -1
        for fd in member.pidfds:
            os.close(fd)
        member.pidfds = ()
        for name in (member.member_id, *names):
            with contextlib.suppress(OSError):  # its supervisor removes it too; a restart sweeps what both missed
                self._cgroup(name).remove()
            try:
                if self._pool is not None:
                    self._pool.delete(name)
            except (AdxError, OSError) as exc:
                self._defer(f"warm member {name}: removing its layer failed (next start sweeps it): {exc}")
        if member.net_index is not None and self.netfilter.ready:
            try:
                self.netfilter.remove(host_if(member.member_id))
            except AdxError as exc:
                self._defer(f"warm member {member.member_id}: removing its chain failed: {exc}")
        self.images.release(member.member_id)
        shutil.rmtree(member.dir, ignore_errors=True)

    # -- claim -------------------------------------------------------------------------------------------------
    def _rename_member(self, member: WarmMember, sandbox_id: str) -> None:
        """The writable layer follows the ID (a btrfs subvolume renames like a dir). The cgroup cannot: cgroup v2
        refuses rename(2) (EPERM, "not a proper migration"), so it keeps the member's name, recorded as the
        sandbox's ``native_name`` (``SandboxTable._native_name`` resolves it)."""
        if self._pool is not None:
            os.rename(self._pool.subvolume(member.member_id), self._pool.subvolume(sandbox_id))

    async def _start_claimed(self, rec: SandboxRecord, member: WarmMember) -> CreateResponse:
        t0 = time.perf_counter()
        self.warm.claiming.pop(rec.sandbox_id, None)
        try:
            if rec.net_policy is not None and rec.net_policy != member.policy and self.netfilter.ready:
                await asyncio.to_thread(self.netfilter.apply, host_if(member.member_id), rec.net_policy)
            fault("warm.before_claim")
            sdir = self.registry.reserve_dir(rec.sandbox_id, member.dir)  # the claim point
        except FileExistsError:
            self._unreserve(rec)
            self.warm.members.setdefault(member.key, []).append(member)  # untouched: still a member
            raise ConflictError(
                f"sandbox ID {rec.sandbox_id} was used before; IDs are never reused",
                details={"sandbox_id": rec.sandbox_id},
            ) from None
        except (AdxError, OSError) as exc:
            self._unreserve(rec)
            self.warm.dropped += 1
            await asyncio.to_thread(self._destroy_member, member)
            raise UnavailableError(f"claiming a warm sandbox failed: {exc}") from exc
        for fd in member.pidfds:  # checked at the take; from the claim point on the start report tells
            os.close(fd)
        member.pidfds = ()
        writer = None
        error: AdxError | None = None
        try:
            await asyncio.to_thread(self._rename_member, member, rec.sandbox_id)
            if rec.execd is not None:
                await self._register_control(rec.sandbox_id)  # before execd exists, as a cold create's
            reader, writer = await asyncio.open_unix_connection(sock=_connect(sdir / CLAIM_SOCKET))
            writer.write(self._spawn_spec(rec).to_json())
            writer.write_eof()
            await writer.drain()
        except OSError as exc:
            error = UnavailableError(f"claiming a warm sandbox failed: {exc}")
        sent_ms = round((time.perf_counter() - t0) * 1000, 2)  # the claim's own steps; the rest: commit + start
        # Sent before the commit releases the lock: the supervisor finds the claim when it gets the lock.
        committed = asyncio.ensure_future(
            asyncio.to_thread(self._commit_created, rec, member.lock_fd, member.member_id)
        )
        member.lock_fd = -1  # the commit closes it
        raw = b""
        try:
            if error is None:
                raw = await asyncio.wait_for(reader.read(), self.config.create_timeout_seconds)
        except TimeoutError:
            await committed
            await self._keep_failed(
                rec, "claimed warm sandbox did not report", "is uncertain (no start report)", "", None
            )
        except OSError as exc:  # the supervisor died after the take's check (it reset the connection)
            error = UnavailableError(f"the claimed warm sandbox's supervisor is gone: {exc}")
        finally:
            if writer is not None:
                writer.close()
            await asyncio.gather(committed, return_exceptions=True)
        await committed  # UncertainOutcomeError (storage failed): the record stays, reserved
        if error is None:
            report: SpawnReport = (
                json.loads(raw) if raw else {"ok": False, "error": "the supervisor exited before starting"}
            )
            claim_ms = round((time.perf_counter() - t0) * 1000, 2)
            try:
                created = self._started(
                    rec, report, "warm claim", logging.INFO, member=member.member_id, claim_ms=claim_ms, sent_ms=sent_ms
                )
            except UnavailableError as exc:
                error = exc
            else:
                self.refill_warm_soon()
                return created
        # As a cold create's failure (SBX-13), plus whatever still carries the member's names.
        try:
            await asyncio.to_thread(self._delete_native, rec)
        except AdxError as cleanup_exc:
            await self._keep_failed(
                rec, f"{error}; cleanup uncertain: {cleanup_exc}", "failed and its cleanup is uncertain", "", error
            )
        await asyncio.to_thread(self._destroy_member, replace(member, dir=sdir / ".gone"))
        self.images.release(rec.sandbox_id)  # the member's hold, which the commit made the sandbox's
        self._forget(rec, "create failed; cleanup confirmed")
        self.refill_warm_soon()
        error.details.setdefault("sandbox_id", rec.sandbox_id)
        raise error
