"""CPU overcommit in the Coordinator's store (RES-4): the Lua admission and the Python placement use one formula,
the ratio a node reports is checked, and memory is never overcommitted (real Redis)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import pytest
from pydantic import ValidationError
from test_store import record

from adx.config import NodeConfig
from adx.coordinator import CoordinatorStore, NoCapacity, rank_nodes
from adx.embedded import EmbeddedRedis
from adx.errors import InvalidInputError
from adx.model import Resources, new_id

GiB = 2**30


@pytest.fixture
async def store(redis_factory: Callable[..., EmbeddedRedis]) -> AsyncIterator[CoordinatorStore]:
    info = redis_factory().read_info()
    assert info is not None
    store = CoordinatorStore.from_url(info.url, timeout=2)
    yield store
    await store.close()


async def node_with(store: CoordinatorStore, ratio: float, cpu: int = 2000, mem: int = 4 * GiB) -> str:
    session = new_id("ses")
    await store.register_node("n1", session=session, address="n1:1", session_ttl=60)
    await store.report_capacity(
        "n1", session, Resources(cpu_millis=cpu, memory_bytes=mem), valid_for=30, cpu_overcommit=ratio
    )
    return session


@pytest.mark.req("RES-4")
@pytest.mark.parametrize("ratio", [1.0, 1.5, 4.0, 2.7])
async def test_lua_admission_and_placement_agree_on_the_limit(store: CoordinatorStore, ratio: float) -> None:
    """Creates of 300 millicores until the store refuses: it admits exactly floor(capacity x ratio), and placement
    (pure Python) called eligible exactly those creates the store took."""
    await node_with(store, ratio)
    taken = 0
    while True:
        node = await store.get_node("n1")
        eligible, refused = rank_nodes([node], Resources(cpu_millis=300, memory_bytes=1), time.time())
        try:
            await store.create_environment(record(cpu=300, mem=1))
        except NoCapacity as exc:
            assert "cpu" in str(exc) and not eligible and "no capacity: cpu" in refused[0].reason
            break
        assert eligible, refused
        taken += 1
    limit = int(2000 * ratio)
    assert taken == limit // 300
    node = await store.get_node("n1")
    assert node.cpu_overcommit == ratio and node.cpu_limit_millis == limit
    assert node.allocatable.cpu_millis == limit - taken * 300


@pytest.mark.req("RES-4")
async def test_memory_is_never_overcommitted(store: CoordinatorStore) -> None:
    await node_with(store, 8.0, mem=4 * GiB)
    await store.create_environment(record(cpu=100, mem=3 * GiB))
    with pytest.raises(NoCapacity, match="memory"):
        await store.create_environment(record(cpu=100, mem=2 * GiB))


async def test_a_bad_ratio_is_refused_naming_the_field(store: CoordinatorStore) -> None:
    for bad in (0.5, 65.0, float("nan")):
        with pytest.raises(InvalidInputError) as caught:
            await node_with(store, bad)
        assert caught.value.field == "cpuOvercommit"
    # 0 is what a node of an earlier version sends (the field unset): no overcommit.
    await node_with(store, 0.0)
    assert (await store.get_node("n1")).cpu_limit_millis == 2000
    with pytest.raises(ValidationError, match="cpu_overcommit"):
        NodeConfig(name="n1", cpu_overcommit=0.9)
