"""The warm pool (issue 16): sandboxes started ahead per shape; a matching create claims one, isolated exactly as
a cold create's sandbox; the pool refills; a SIGKILL mid-claim or mid-refill leaves no leak and no double use.
docs/sandboxd.md, 'Warm pool'."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest
from sbx_helpers import LAYOUT, Daemon, DaemonFactory, wait_until
from test_runtime_control import execd_request, ready, run, until

from adx.errors import AdxError, ConflictError
from adx.sandboxd import CreateRequest, ResourcesSpec, RuntimeControlSubscription, SandboxdClient, ref_of
from adx.sandboxd._cgroups import SandboxCgroup
from adx.sandboxd._models import CreateResponse, WarmPoolInfo
from adx.sandboxd._netpolicy import table_name
from adx.sandboxd._states import State
from adx.sandboxd._userns import IDS_PER_SANDBOX
from adx.sandboxd._veth import host_if

#: User namespace, egress (veth + the default policy): the full create of issue 13.
WARM = {"warm_pool": 2, "user_namespace": "on", "defaults": {"network": "veth"}}

SHOW = 'echo "X=$X host=$(hostname)"; cat /proc/self/uid_map; exec sleep 1000'


async def _ready(c: SandboxdClient, n: int) -> WarmPoolInfo:
    deadline = time.monotonic() + 30
    while True:
        pool = (await c.health()).warm_pool
        assert pool is not None
        if pool.ready >= n:
            return pool
        assert time.monotonic() < deadline, f"warm pool not ready: {pool}"
        await asyncio.sleep(0.05)


def _cgroup_root(d: Daemon) -> Path:
    assert LAYOUT.v2_root is not None
    return LAYOUT.v2_root / d.cgroup_parent


def _warm_cgroups(d: Daemon) -> set[str]:
    root = _cgroup_root(d)
    return {p.name for p in root.iterdir() if p.name.startswith("_warm-")} if root.is_dir() else set()


def _warm_dirs(d: Daemon) -> set[str]:
    return {p.name for p in (d.state_dir / "sandboxes").iterdir() if p.name.startswith(".warm-")}


def _procs(cgroup: Path) -> set[int]:
    path = cgroup / "cgroup.procs"
    return {int(x) for x in path.read_text().split()} if path.exists() else set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


_LIMIT_FILES = ("memory.max", "memory.limit_in_bytes", "cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us", "pids.max")


def _limits(d: Daemon, cgroup: Path) -> dict[str, str]:
    """Every limit file of the sandbox's cgroups (v2, or the v1 hierarchies of a hybrid host)."""
    out = {}
    for path in SandboxCgroup(LAYOUT, d.cgroup_parent, cgroup.name).dirs():
        for name in _LIMIT_FILES:
            if (path / name).exists():
                out[f"{path.parent.parent.name}/{name}"] = (path / name).read_text().strip()
    assert len(out) >= 3, out
    return out


def _chain(d: Daemon, veth: str) -> str:
    """The sandbox's nftables chain, its and its table's names blanked (the rules are what must match)."""
    table = table_name(d.state_dir)
    out = subprocess.run(["nft", "list", "chain", "inet", table, f"sb_{veth}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.replace(veth, "VETH").replace(table, "TABLE")


def _cgroup_of(created: CreateResponse) -> Path:
    assert created.sandbox.native is not None
    return Path(created.sandbox.native.cgroup_dir)


async def _output(c: SandboxdClient, created: CreateResponse, want: str) -> str:
    deadline = time.monotonic() + 10
    while want not in (text := (await c.output(ref_of(created))).output):
        assert time.monotonic() < deadline, text
        await asyncio.sleep(0.05)
    return text


@pytest.mark.req("SEC-3", "SBX-5")
async def test_a_matching_create_claims_a_member_isolated_exactly_as_a_cold_create(sandboxd: DaemonFactory) -> None:
    warm_d = sandboxd("warm", **WARM)
    cold_d = sandboxd("cold", **{**WARM, "warm_pool": 0})
    async with warm_d.client() as wc, cold_d.client() as cc:
        await _ready(wc, 2)
        req = CreateRequest(request_id="a", argv=["/bin/sh", "-c", SHOW], env={"X": "42"})
        warm = await wc.create(req)
        cold = await cc.create(req)
        pool = (await wc.health()).warm_pool
        assert pool is not None and pool.claims == 1 and pool.misses == 0
        assert (await cc.health()).warm_pool == WarmPoolInfo(size=0, ready=0, starting=0, shapes=0, claims=0, misses=0)
        sid = warm.sandbox.sandbox_id
        assert f'msg="warm claim" sandbox_id={sid}' in warm_d.log()
        # The claimed sandbox runs in the member's cgroup (cgroup v2 refuses renames) under its own ID.
        member = _cgroup_of(warm).name
        assert member.startswith("_warm-") and _cgroup_of(cold).name == cold.sandbox.sandbox_id
        # Same environment, hostname and output path as a cold one.
        for c, created in ((wc, warm), (cc, cold)):
            text = await _output(c, created, "X=42")
            assert f"X=42 host={created.sandbox.sandbox_id}" in text
            # User namespace: root inside is a 65536-ID slice of the node's range, as a cold sandbox's.
            inside, base, size = text.splitlines()[1].split()
            assert (inside, size) == ("0", str(IDS_PER_SANDBOX)) and int(base) >= 1 << 16
            assert int(base) % IDS_PER_SANDBOX == 0
        # The very limits, and the init (and only the sandbox's processes) in that cgroup.
        assert _limits(warm_d, _cgroup_of(warm)) == _limits(cold_d, _cgroup_of(cold))
        assert _procs(_cgroup_of(warm)) and all(_alive(p) for p in _procs(_cgroup_of(warm)))
        # Egress: an address of the node's pool and the same policy, in a chain holding the same rules.
        assert warm.sandbox.address and warm.sandbox.network_policy == cold.sandbox.network_policy
        assert _chain(warm_d, host_if(member)) == _chain(cold_d, host_if(cold.sandbox.sandbox_id))
        # The member is gone from the pool; the pool refills in the background.
        assert ".warm-" + member.removeprefix("_warm-") not in _warm_dirs(warm_d)  # renamed to the sandbox's
        await _ready(wc, 2)
        # Delete finds everything by the sandbox ID (the cgroup through the record's alias).
        await wc.delete(ref_of(warm))
        assert not _cgroup_of(warm).exists()
        with pytest.raises(ConflictError):  # IDs are never reused, a claimed one neither
            await wc.create(CreateRequest(request_id="again", sandbox_id=sid, argv=["true"]))
        await cc.delete(ref_of(cold))


async def test_a_shape_not_in_the_pool_starts_cold_and_is_kept_warm_from_then_on(sandboxd: DaemonFactory) -> None:
    d = sandboxd(**WARM)
    async with d.client() as c:
        await _ready(c, 2)
        big = CreateRequest(request_id="big", argv=["sleep", "1000"], resources=ResourcesSpec(memory_bytes=256 << 20))
        first = await c.create(big)
        pool = (await c.health()).warm_pool
        assert pool is not None and (pool.claims, pool.misses) == (0, 1)
        assert _cgroup_of(first).name == first.sandbox.sandbox_id  # cold
        assert str(256 << 20) in _limits(d, _cgroup_of(first)).values()
        # The shape is asked for now: kept warm (two members) beside the defaults' (one: nobody asked for it).
        pool = await _ready(c, 3)
        assert pool.shapes == 2
        second = await c.create(big.model_copy(update={"request_id": "big2"}))
        assert _cgroup_of(second).name.startswith("_warm-")
        assert _limits(d, _cgroup_of(second)) == _limits(d, _cgroup_of(first))
        pool = (await c.health()).warm_pool
        assert pool is not None and pool.claims == 1
        for created in (first, second):
            await c.delete(ref_of(created))


async def test_three_shapes_interleaved_all_claim_once_each_has_been_seen(sandboxd: DaemonFactory) -> None:
    """The kept shapes follow demand: three shapes taking turns (as the API's native, native-egress and E2B
    creates do) each get members once asked for, so from the second round on every create claims. Two kept
    shapes (the defaults' pinned, then the most recent other) made two of the three go cold every time."""
    d = sandboxd(**WARM)
    mib = 1 << 20
    shapes = [
        CreateRequest(request_id="plain", argv=["sleep", "1000"]),  # the defaults' shape (veth, egress)
        CreateRequest(request_id="big", argv=["sleep", "1000"], resources=ResourcesSpec(memory_bytes=256 * mib)),
        CreateRequest(request_id="closed", argv=["sleep", "1000"], network="none"),
    ]
    async with d.client() as c:
        await _ready(c, 2)
        for round_ in range(3):
            for i, req in enumerate(shapes):
                created = await c.create(req.model_copy(update={"request_id": f"{req.request_id}-{round_}"}))
                warm = _cgroup_of(created).name.startswith("_warm-")
                assert warm or (round_, i) in ((0, 1), (0, 2)), f"round {round_}: {req.request_id} went cold"
                await c.delete(ref_of(created))
                seen = 3 if round_ else i + 1
                await _ready(c, 2 * seen)  # each shape seen is asked for alike: two members each
        pool = (await c.health()).warm_pool
        assert pool is not None and (pool.claims, pool.misses, pool.shapes) == (7, 2, 3)


async def test_pool_off_is_the_cold_path(sandboxd: DaemonFactory) -> None:
    d = sandboxd(**{**WARM, "warm_pool": 0})
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="a", argv=["sleep", "1000"]))
        assert _cgroup_of(created).name == created.sandbox.sandbox_id
        await asyncio.sleep(0.3)  # a refill would have started by now
        pool = (await c.health()).warm_pool
        assert pool is not None and (pool.size, pool.claims, pool.made) == (0, 0, 0)
        assert not _warm_cgroups(d) and not _warm_dirs(d)
        await c.delete(ref_of(created))


def _member_pids(d: Daemon) -> set[int]:
    return {p for name in _warm_cgroups(d) for p in _procs(_cgroup_root(d) / name)}


@pytest.mark.req("SBX-10", "SBX-13")
@pytest.mark.parametrize("point", ["warm.before_claim", "create.before_commit"])
async def test_sigkill_mid_claim_leaves_a_member_or_an_uncommitted_id_never_both_nor_a_leak(
    sandboxd: DaemonFactory, point: str
) -> None:
    """Before the claim point (the dir rename) the member is still a member: removed at restart, the ID free.
    After it, before the record commit: the ID is uncommitted (blocked for good), the member's remains swept."""
    d = sandboxd(**WARM, start=False)
    d.start(env={"ADX_SANDBOXD_FAULTS": point})
    async with d.client() as c:
        await _ready(c, 2)
        members, pids = _warm_cgroups(d), _member_pids(d)
        assert len(members) == 2 and len(pids) == 2
        with pytest.raises((AdxError, OSError)):
            await c.create(CreateRequest(request_id="k", sandbox_id="killed-mid-claim", argv=["sleep", "1000"]))
    assert d.proc is not None and d.proc.wait(10) == -9
    d.start()
    async with d.client() as c:
        await _ready(c, 2)
        # Nothing of the earlier run's members is left: no cgroup, no dir, no process (their supervisors exit).
        assert not members & _warm_cgroups(d)
        wait_until(lambda: not any(_alive(p) for p in pids))
        assert len(_warm_dirs(d)) == 2 and len(_warm_cgroups(d)) == 2  # this run's, fresh
        assert not (await c.list())
        if point == "warm.before_claim":
            created = await c.create(CreateRequest(request_id="k2", sandbox_id="killed-mid-claim", argv=["true"]))
            await c.delete(ref_of(created))
        else:
            with pytest.raises(ConflictError):
                await c.create(CreateRequest(request_id="k2", sandbox_id="killed-mid-claim", argv=["true"]))
        # No double use: a claim now takes one of this run's members, with a slice no live sandbox has.
        a = await c.create(CreateRequest(request_id="a", argv=["sleep", "1000"]))
        b = await c.create(CreateRequest(request_id="b", argv=["sleep", "1000"]))
        assert _cgroup_of(a).name in _warm_cgroups(d) and _cgroup_of(a) != _cgroup_of(b)
        assert a.sandbox.id_base != b.sandbox.id_base
        for created in (a, b):
            await c.delete(ref_of(created))


@pytest.mark.req("SBX-10")
async def test_sigkill_mid_refill_leaves_no_member_behind_after_restart(sandboxd: DaemonFactory) -> None:
    d = sandboxd(**WARM, start=False)
    d.start(env={"ADX_SANDBOXD_FAULTS": "warm.member_started"})  # the first member started, not yet listed
    half: set[str] = set()
    pids: set[int] = set()
    assert d.proc is not None
    while d.proc.poll() is None:  # the member, parked, while the fault point waits to SIGKILL
        half |= _warm_cgroups(d)
        pids |= _member_pids(d)
        await asyncio.sleep(0.01)
    assert d.proc.returncode == -9
    assert half and pids  # its init was running, parked
    stale_dirs = _warm_dirs(d)
    assert stale_dirs
    d.start()
    async with d.client() as c:
        await _ready(c, 2)
        assert not half & _warm_cgroups(d) and not stale_dirs & _warm_dirs(d)
        wait_until(lambda: not any(_alive(p) for p in pids))
        assert len(_warm_dirs(d)) == 2
        created = await c.create(CreateRequest(request_id="a", argv=["sleep", "1000"]))
        assert _cgroup_of(created).name.startswith("_warm-")
        await c.delete(ref_of(created))


@pytest.mark.req("CTL-1")
async def test_an_execd_create_claims_a_member_of_its_shape_and_execd_serves_under_the_sandbox_id(
    sandboxd: DaemonFactory,
) -> None:
    """execd as PID 1 (the API's creates): the shape is learned from the first (cold) create; the next claims a
    member whose PID 1 runs execd in process with the claim's argv (its sandbox ID) and reports ready."""
    d = sandboxd(**WARM)
    async with d.client() as c:
        health = await c.health()
        assert health.runtime_control_socket is not None
        async with RuntimeControlSubscription(health.runtime_control_socket) as sub:
            first = await c.create(execd_request("execd-cold"))
            await _ready(c, 3)  # this shape's two, the defaults' one (not asked for)
            created = await c.create(execd_request("execd-warm"))
            pool = (await c.health()).warm_pool
            assert pool is not None and (pool.claims, pool.misses) == (1, 1)
            assert _cgroup_of(created).name.startswith("_warm-")
            await until(sub, ready("execd-cold", "execd-warm"))
        assert created.sandbox.execd_socket is not None
        out, code = await run(created.sandbox.execd_socket, "hostname; echo $ADX_SANDBOX_ID")
        assert (out.split(), code) == (["execd-warm", "execd-warm"], 0)
        for sandbox in (first, created):
            await c.delete(ref_of(sandbox))


async def test_members_reserve_nothing_yet_never_let_the_node_overcommit_memory(sandboxd: DaemonFactory) -> None:
    """Capacity for three 128 MiB sandboxes: a create is admitted as if no member existed (members are no
    Environments), and members plus reservations never exceed the node's memory (the pool shrinks to fit)."""
    mib = 1 << 20
    d = sandboxd(**{**WARM, "capacity": {"memory_bytes": 384 * mib, "disk_bytes": 64 << 30}})
    async with d.client() as c:
        await _ready(c, 2)
        made = []
        for i, members_after in enumerate((2, 1, 0)):  # room left for members: 256, 128, 0 MiB
            made.append(await c.create(CreateRequest(request_id=f"s{i}", argv=["sleep", "1000"])))
            assert _cgroup_of(made[-1]).name.startswith("_warm-")  # the claims were admitted like cold creates
            deadline = time.monotonic() + 30
            while (pool := (await c.health()).warm_pool) is None or (pool.ready, pool.starting) != (members_after, 0):
                assert time.monotonic() < deadline, pool
                await asyncio.sleep(0.05)
            assert 128 * mib * (len(made) + members_after) <= 384 * mib
        resource = await c.resource()
        assert resource.reserved.memory_bytes == 384 * mib  # members are not reserved
        with pytest.raises(ConflictError):  # full: cold admission refuses, as without a pool
            await c.create(CreateRequest(request_id="over", argv=["sleep", "1000"]))
        await c.delete(ref_of(made[0]))
        await _ready(c, 1)  # room again: the pool refills into it
        for created in made[1:]:
            await c.delete(ref_of(created))


@pytest.mark.req("SBX-1", "SBX-10")
async def test_a_claimed_sandbox_is_adopted_after_a_sigkill_and_pause_stats_delete_find_its_cgroup(
    sandboxd: DaemonFactory,
) -> None:
    """A claimed sandbox keeps the member's cgroup: a restart adopts it (its cgroup is named by its record, so
    the sweep of an earlier run's members spares it), and pause, stats and delete reach it by its ID."""
    d = sandboxd(**WARM)
    async with d.client() as c:
        await _ready(c, 2)
        created = await c.create(CreateRequest(request_id="a", argv=["sleep", "1000"]))
        cgroup = _cgroup_of(created)
        assert cgroup.name.startswith("_warm-")
        pids = _procs(cgroup)
    d.kill()
    d.start()
    async with d.client() as c:
        info = await c.get(ref_of(created))
        assert info.state == State.RUNNING and _procs(cgroup) == pids
        assert cgroup.name in _warm_cgroups(d)
        paused = await c.pause(ref_of(created))
        assert paused.state == State.PAUSED
        assert (await c.resume(ref_of(created))).state == State.RUNNING
        stats = await c.stats(ref_of(created))
        assert stats.pids >= 1 and stats.memory_bytes > 0
        await c.delete(ref_of(created))
        assert not cgroup.exists() and not _procs(cgroup)


def _supervisors(d: Daemon) -> dict[str, int]:
    """Each member's supervisor: the parent of its init (the one process in its cgroup while parked)."""
    out = {}
    for name in _warm_cgroups(d):
        (init,) = _procs(_cgroup_root(d) / name)
        status = Path(f"/proc/{init}/status").read_text()
        out[name] = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    return out


async def test_a_member_whose_supervisor_died_is_never_claimed_and_is_replaced(sandboxd: DaemonFactory) -> None:
    """Issue 13/16: a member whose supervisor died counted as ready, and the create that claimed it failed (503)
    instead of taking a live member or starting cold. A dead member is found at the claim and on the maintenance
    tick (every 0.2 s here), destroyed, not counted, and replaced."""
    d = sandboxd(**WARM)
    async with d.client() as c:
        await _ready(c, 2)
        supervisors = _supervisors(d)
        assert len(supervisors) == 2
        # Both die: the create can only succeed by seeing it before the claim (then it goes cold).
        for pid in supervisors.values():
            os.kill(pid, 9)
        wait_until(lambda: not any(_alive(p) for p in supervisors.values()))  # a SIGKILL lands a moment later
        created = await c.create(CreateRequest(request_id="a", argv=["/bin/sh", "-c", "exec sleep 1000"]))
        assert created.sandbox.state == State.RUNNING
        assert _cgroup_of(created).name not in supervisors  # not a dead member's
        pool = (await c.health()).warm_pool
        # Cold (the claim's check, or the tick before it, found both dead), or a member the tick's refill had
        # made meanwhile.
        assert pool is not None and pool.claims + pool.misses == 1
        # The dead members are destroyed (cgroup, dir) and fresh ones made.
        wait_until(lambda: not set(supervisors) & _warm_cgroups(d), timeout=10)
        pool = await _ready(c, 2)
        assert pool.dropped >= 2
        # A death while idle: the maintenance tick finds it, with no create to claim it.
        supervisors = _supervisors(d)
        victim, survivor = sorted(supervisors)
        os.kill(supervisors[victim], 9)
        wait_until(lambda: victim not in _warm_cgroups(d), timeout=10)
        assert survivor in _warm_cgroups(d)
        await _ready(c, 2)
        claimed = await c.create(CreateRequest(request_id="b", argv=["sleep", "1000"]))
        assert _cgroup_of(claimed).name.startswith("_warm-") and _cgroup_of(claimed).name != victim
        for sandbox in (created, claimed):
            await c.delete(ref_of(sandbox))
