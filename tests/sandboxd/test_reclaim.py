"""Reclaim: the owner gives a sandbox a new token when its holder lost the old one (a node whose execution file
is gone), on a real sandboxd. The old token is void at once; a retry with the same new token converges, also
after a SIGKILL on either side of the record's rename; the reclaimed sandbox is then deleted like any other.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid

import pytest
from pydantic import ValidationError
from sbx_helpers import Daemon, DaemonFactory, wait_until

from adx.errors import ConflictError, NotFoundError, UncertainOutcomeError
from adx.sandboxd import (
    CreateRequest,
    CreateResponse,
    PermissionDeniedError,
    ReclaimRequest,
    SandboxRef,
    State,
    ref_of,
)
from adx.sandboxd._spawn_client import FAULTS_ENV

SLEEPER = ["sleep", "1000"]


def _token() -> str:
    return secrets.token_urlsafe(32)


def _persisted_token(d: Daemon, sandbox_id: str) -> str:
    token: str = json.loads((d.sandbox_dir(sandbox_id) / "record.json").read_text())["record"]["token"]
    return token


async def _owner(d: Daemon) -> str:
    async with d.client() as c:
        return (await c.health()).owner


async def _create(d: Daemon, request_id: str, token: str | None = None) -> CreateResponse:
    async with d.client() as c:
        return await c.create(CreateRequest(request_id=request_id, argv=SLEEPER, token=token))


def _request(created: CreateResponse, token: str, **changes: object) -> ReclaimRequest:
    s = created.sandbox
    fields = {"owner": s.owner, "sandbox_id": s.sandbox_id, "generation": s.generation, "token": token, **changes}
    return ReclaimRequest.model_validate(fields)


async def _old_token_refused(d: Daemon, old: SandboxRef) -> None:
    async with d.client() as c:
        for call in (c.get, c.pause, c.resume, c.stats, c.delete):
            with pytest.raises(PermissionDeniedError, match=r"invalid token.*replaced it"):
                await call(old)
        with pytest.raises(PermissionDeniedError, match="invalid token"):
            await c.checkpoint(old)
        with pytest.raises(PermissionDeniedError, match="invalid token"):
            await c.wait(old, timeout_seconds=0.1)


@pytest.mark.req("SBX-4", "SBX-2", "SBX-1")
async def test_reclaim_gives_a_working_token_and_voids_the_old_one(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    old_token = _token()
    created = await _create(d, "lost", token=old_token)
    sid = created.sandbox.sandbox_id
    old = ref_of(created)
    pids = d.settled_procs(sid, count=1)
    new_token = _token()
    async with d.client() as c:
        reclaimed = await c.reclaim(_request(created, new_token))
        assert reclaimed.token == new_token and not reclaimed.replayed
        assert reclaimed.sandbox.state == State.RUNNING and reclaimed.sandbox.reclaimed_at is not None
        assert reclaimed.sandbox.native == created.sandbox.native  # the same sandbox: nothing restarted (SBX-5)
        assert _persisted_token(d, sid) == new_token  # durable before the reply (SBX-2: the token is persisted)
        new = ref_of(reclaimed)
        assert new == old.model_copy(update={"token": new_token})
        await _old_token_refused(d, old)
        # The create's own holder cannot get the new token by replaying its create (same request, same token).
        with pytest.raises(ConflictError, match=r"request_id.*replaced its token"):
            await c.create(CreateRequest(request_id="lost", argv=SLEEPER, token=old_token))
        # The new token does everything the old one did, on the same processes.
        assert (await c.get(new)).state == State.RUNNING
        assert (await c.pause(new)).state == State.PAUSED
        assert (await c.resume(new)).state == State.RUNNING
        assert (await c.stats(new)).pids == 1
        assert d.cgroup_procs(sid) == pids
        # A retried Reclaim (its reply lost) with the same token: success again, nothing changed.
        again = await c.reclaim(_request(created, new_token))
        assert again.replayed and again.token == new_token
        assert again.sandbox.reclaimed_at == reclaimed.sandbox.reclaimed_at
    # The new token survives a restart; the old one stays void (SBX-1).
    d.kill()
    d.start()
    await _old_token_refused(d, old)
    async with d.client() as c:
        assert (await c.get(new)).state == State.RUNNING
        assert d.cgroup_procs(sid) == pids
        await c.delete(new)
        assert await c.list() == []


@pytest.mark.req("SBX-4")
async def test_reclaim_refusals_name_the_field_and_change_nothing(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    created = await _create(d, "a")
    doomed = await _create(d, "b")
    ref = ref_of(created)
    async with d.client() as c:
        await c.delete(ref_of(doomed))
        with pytest.raises(NotFoundError, match="sandbox_id: no sandbox sb-nope") as unknown:
            await c.reclaim(_request(created, _token(), sandbox_id="sb-nope"))
        assert unknown.value.details["field"] == "sandbox_id"
        with pytest.raises(NotFoundError, match=r"sandbox_id: .* was deleted \(tombstoned\)") as tomb:
            await c.reclaim(_request(doomed, _token()))
        assert tomb.value.details == {"field": "sandbox_id", "tombstone": True}
        with pytest.raises(ConflictError, match=r"generation: .* is generation 1, not 2") as gen:
            await c.reclaim(_request(created, _token(), generation=2))
        assert gen.value.details["field"] == "generation"
        with pytest.raises(PermissionDeniedError, match=r"owner: .* is not this sandboxd's owner"):
            await c.reclaim(_request(created, _token(), owner=str(uuid.uuid4())))
        # Malformed requests, sent raw (the typed model refuses them before they leave the client).
        valid = _request(created, _token()).model_dump()
        for changes, field, reason in [
            ({"token": "short"}, "token", "at least 32 characters"),
            ({"token": "x" * 31 + "/"}, "token", "should match pattern"),
            ({"token": "x" * 129}, "token", "at most 128 characters"),
            ({"owner": None}, "owner", "valid string"),
            ({"sandbox_id": "../etc"}, "sandbox_id", "must match"),
            ({"generation": 0}, "generation", "greater than or equal to 1"),
        ]:
            resp = await c.raw("Reclaim", {**valid, **changes})
            assert resp.status_code == 422, (changes, resp.content)
            err = resp.json()["error"]
            assert err["code"] == "invalid_input" and err["details"]["field"] == field, err
            assert reason in err["details"]["reason"], err
        missing = {k: v for k, v in valid.items() if k != "token"}
        resp = await c.raw("Reclaim", missing)
        assert resp.status_code == 422 and resp.json()["error"]["details"]["field"] == "token"
        # Nothing changed: the original token still works, the record was never rewritten.
        assert (await c.get(ref)).reclaimed_at is None
        assert _persisted_token(d, ref.sandbox_id) == ref.token
    with pytest.raises(ValidationError, match="token"):
        _request(created, "short")  # the typed model refuses it locally


@pytest.mark.req("SBX-2", "SBX-6", "SBX-10")
@pytest.mark.parametrize("point", ["reclaim.before_rename", "reclaim.after_persist"])
async def test_sigkill_mid_reclaim_then_a_retry_with_the_same_token_converges(
    sandboxd: DaemonFactory, point: str
) -> None:
    d = sandboxd(start=False)
    d.start(env={FAULTS_ENV: point})
    created = await _create(d, "x")
    sid = created.sandbox.sandbox_id
    pids = d.settled_procs(sid, count=1)
    new_token = _token()
    async with d.client() as c:
        with pytest.raises(UncertainOutcomeError):  # SBX-6: the reply is lost, the outcome unknown
            await c.reclaim(_request(created, new_token))
    assert d.proc is not None and d.proc.wait(10) == -9
    persisted = _persisted_token(d, sid)
    # The record holds the old token or the new one, whole (temp + fsync + rename).
    assert persisted == (created.token if point == "reclaim.before_rename" else new_token)

    d.start()
    async with d.client() as c:
        if point == "reclaim.before_rename":
            assert (await c.get(ref_of(created))).state == State.RUNNING  # nothing happened yet
        retried = await c.reclaim(_request(created, new_token))
        assert retried.token == new_token
        assert retried.replayed == (point == "reclaim.after_persist")
        assert retried.sandbox.state == State.RUNNING
        assert d.cgroup_procs(sid) == pids  # the same workload throughout
    await _old_token_refused(d, ref_of(created))
    async with d.client() as c:
        assert (await c.health()).deferred_errors == []
        await c.delete(ref_of(retried))
        assert await c.list() == []


@pytest.mark.req("SBX-4", "SBX-7", "SBX-12")
async def test_a_reclaimed_sandbox_is_deleted_and_its_resources_released(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        idle = await c.resource()
        created = await c.create(CreateRequest(request_id="r", argv=SLEEPER))
        sid = created.sandbox.sandbox_id
        d.settled_procs(sid, count=1)
        assert (await c.resource()).reserved.memory_bytes == idle.reserved.memory_bytes + (128 << 20)
        reclaimed = await c.reclaim(_request(created, _token()))
        deleted = await c.delete(ref_of(reclaimed))
        assert deleted.state == State.DELETED
        assert await c.list() == []
        assert (await c.resource()).reserved == idle.reserved
        assert not d.v2_cgroup(sid).exists()
        # Only the tombstone and the lifecycle lock are left: no record, no token (SBX-12).
        assert sorted(p.name for p in d.sandbox_dir(sid).iterdir()) == ["lifecycle.lock", "tombstone.json"]
        with pytest.raises(NotFoundError, match="tombstoned"):
            await c.reclaim(_request(created, _token()))
        with pytest.raises(NotFoundError, match="was deleted"):
            await c.get(ref_of(created))


@pytest.mark.req("SBX-4")
async def test_a_wait_in_flight_with_the_old_token_ends_at_the_reclaim(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    created = await _create(d, "w")
    async with d.client() as c:
        waiting = asyncio.ensure_future(c.wait(ref_of(created), timeout_seconds=60))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        reclaimed = await c.reclaim(_request(created, _token()))
        with pytest.raises(PermissionDeniedError, match="invalid token"):
            await asyncio.wait_for(waiting, 5)
        await c.delete(ref_of(reclaimed))
        wait_until(lambda: not d.v2_cgroup(created.sandbox.sandbox_id).exists())


@pytest.mark.req("SBX-4")
async def test_a_call_authenticated_with_the_old_token_and_queued_behind_the_reclaim_is_refused(
    sandboxd: DaemonFactory,
) -> None:
    # A checkpoint of a large upper layer holds the sandbox's lock; meanwhile a Reclaim queues, then a Delete
    # with the old token (it passes the first check, the token is still valid) queues behind it. The lock is
    # FIFO: the Reclaim runs first, and the Delete, re-checked under the lock, must not delete.
    d = sandboxd()
    blob = ["/bin/sh", "-c", "head -c 150000000 /dev/urandom > /work/b.tmp && mv /work/b.tmp /work/b; sleep 1000"]
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="q", argv=blob))
    sid = created.sandbox.sandbox_id
    wait_until(lambda: (d.sandbox_dir(sid) / "upper/work/b").exists(), timeout=60)
    old = ref_of(created)
    new_token = _token()
    async with d.client() as c1, d.client() as c2, d.client() as c3:
        checkpoint = asyncio.ensure_future(c1.checkpoint(old))
        await asyncio.sleep(0.1)
        reclaim = asyncio.ensure_future(c2.reclaim(_request(created, new_token)))
        await asyncio.sleep(0.05)
        delete = asyncio.ensure_future(c3.delete(old))
        await asyncio.sleep(0.05)
        assert not checkpoint.done(), "the checkpoint ended before the queue formed; the test proves nothing"
        ck = await checkpoint
        reclaimed = await reclaim
        with pytest.raises(PermissionDeniedError, match="invalid token"):
            await delete
        new = ref_of(reclaimed)
        assert (await c1.get(new)).state == State.RUNNING
        await c1.delete_checkpoint(ck.location, ck.digest)
        await c1.delete(new)
        assert await c1.list() == []
