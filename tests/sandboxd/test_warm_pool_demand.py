"""The warm pool's kept shapes follow demand (issue 16): the shapes created in the last window, most wanted first,
up to the cap; members per shape by how often it is asked for. Bookkeeping only (``_warm_pool.WarmPool``); the
daemon side is in test_warm_pool.py. docs/sandboxd.md, 'Warm pool'."""

from __future__ import annotations

from pathlib import Path

from adx.sandboxd._models import Resources
from adx.sandboxd._warm_pool import DEMAND_WINDOW_SECONDS, WarmKey, WarmMember, WarmPool


def _key(memory_mib: int, network: str = "none") -> WarmKey:
    return WarmKey.of(
        None,
        None,
        None,
        Resources(cpu_millis=500, memory_bytes=memory_mib << 20, pids_max=512, disk_bytes=1 << 30),
        network,
    )


NATIVE, EGRESS, E2B, RARE = _key(256), _key(256, "veth"), _key(512, "veth"), _key(1024)
DEFAULTS = _key(128)


def _member(key: WarmKey, n: int) -> WarmMember:
    return WarmMember(f"_warm-{n}", key, Path(f"/nonexistent/{n}"), -1, None, None, None)


def test_three_shapes_interleaved_are_all_kept_and_the_defaults_shape_only_while_unasked() -> None:
    pool = WarmPool(size=2, shapes=4, pinned=DEFAULTS)
    assert pool.targets(now=0) == {DEFAULTS: 2}  # before any create: the defaults' shape, fully
    for i in range(9):
        pool.take((NATIVE, EGRESS, E2B)[i % 3], now=i)
    # Each asked for as often: all kept with the full size, most recent first; the defaults' shape keeps one.
    assert pool.targets(now=9) == {E2B: 2, EGRESS: 2, NATIVE: 2, DEFAULTS: 1}
    assert (pool.misses, pool.claims) == (9, 0)  # nothing was ready: counted as demand all the same


def test_the_cap_keeps_the_most_wanted_shapes_and_a_rare_shape_gets_one_member() -> None:
    pool = WarmPool(size=2, shapes=3, pinned=DEFAULTS)
    for i in range(10):
        pool.take(NATIVE if i % 2 else EGRESS, now=i)
    pool.take(RARE, now=10)
    # RARE is the most recent but asked for once against five: one member; the cap of three leaves out DEFAULTS.
    assert pool.targets(now=10) == {NATIVE: 2, EGRESS: 2, RARE: 1}
    pool.take(DEFAULTS, now=11)
    pool.take(DEFAULTS, now=12)  # two of the defaults' now outrank RARE's one
    assert pool.kept(now=12) == [NATIVE, EGRESS, DEFAULTS]


def test_demand_older_than_the_window_is_forgotten_and_its_members_are_surplus() -> None:
    pool = WarmPool(size=2, shapes=4, pinned=DEFAULTS)
    pool.take(RARE, now=0)
    pool.members = {RARE: [_member(RARE, 1), _member(RARE, 2)], DEFAULTS: [_member(DEFAULTS, 3)]}
    assert pool.surplus(now=1) == [] and pool.targets(now=1) == {RARE: 2, DEFAULTS: 1}
    later = DEMAND_WINDOW_SECONDS + 1
    pool.take(NATIVE, now=later)
    pool.take(NATIVE, now=later)
    assert pool.targets(now=later) == {NATIVE: 2, DEFAULTS: 1}
    dropped = pool.surplus(now=later)
    assert sorted(m.member_id for m in dropped) == ["_warm-1", "_warm-2"] and RARE not in pool.members


def test_a_shape_beyond_its_target_gives_its_oldest_members_and_refill_fills_the_emptiest_first() -> None:
    pool = WarmPool(size=2, shapes=4)
    for i in range(4):
        pool.take(NATIVE, now=i)
    pool.take(EGRESS, now=4)  # one against four: target 1
    pool.members = {EGRESS: [_member(EGRESS, 1), _member(EGRESS, 2)], NATIVE: [_member(NATIVE, 3)]}
    assert [m.member_id for m in pool.surplus(now=5)] == ["_warm-1"]  # the oldest; the newest is claimed first
    assert pool.next_wanted(now=5) == NATIVE  # 1 of 2
    pool.making["_warm-4"] = _member(NATIVE, 4)
    assert pool.next_wanted(now=5) is None  # all full


def test_pool_off_keeps_nothing() -> None:
    pool = WarmPool(size=0, shapes=4, pinned=DEFAULTS)
    assert pool.take(NATIVE, now=0) is None and pool.targets(now=0) == {} and pool.misses == 0


def test_a_dead_member_is_never_taken_nor_counted_but_keeps_its_ids_until_destroyed() -> None:
    """Issue 13/16: a member whose supervisor died was handed to a create (which then failed)."""
    pool = WarmPool(size=2, shapes=4)
    dead, live = _member(NATIVE, 1), _member(NATIVE, 2)
    dead.id_base, dead.net_index, live.id_base = 1 << 16, 7, 2 << 16
    pool.members[NATIVE] = [live, dead]  # the dead one would be taken first (the last)
    assert pool.take(NATIVE, now=0, alive=lambda m: m is not dead) is live
    assert (pool.claims, pool.misses, pool.dead) == (1, 0, [dead])
    assert pool.info().ready == 0 and 1 << 16 in pool.used_id_bases() and 7 in pool.used_net_indexes()
    # Only dead ones: a miss (the create goes cold).
    pool.members[NATIVE] = [dead2 := _member(NATIVE, 3)]
    assert pool.take(NATIVE, now=1, alive=lambda m: False) is None
    assert (pool.claims, pool.misses, pool.dead) == (1, 1, [dead, dead2])
    # The maintenance tick's sweep: only the dead leave the pool.
    a, b = _member(EGRESS, 4), _member(EGRESS, 5)
    pool.members[EGRESS] = [a, b]
    assert pool.cull(lambda m: m is not b) == 1
    assert pool.members[EGRESS] == [a] and pool.dead[-1] is b
