"""A warm member of a store image holds its layers from the start (no GC takes them while it waits); its claim
moves that hold to the sandbox (a rename and one fsync on the claim's path, issue 16) and the delete releases
it. docs/sandboxd.md, 'Warm pool'."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from sbx_helpers import DaemonFactory
from test_images import CACHE, debian_store  # noqa: F401 - the session's Debian image (a fixture)

from adx.images import ImageStore
from adx.sandboxd import CreateRequest, ref_of

pytestmark = pytest.mark.slow


def _holds(store: ImageStore) -> dict[str, list[str]]:
    return {p.stem: json.loads(p.read_text()) for p in store.refs_dir.glob("*.json")}


async def test_a_claim_moves_the_members_hold_on_its_layers_to_the_sandbox(
    sandboxd: DaemonFactory,
    debian_store: ImageStore,  # noqa: F811
) -> None:
    d = sandboxd(images_dir=str(CACHE), warm_pool=1)
    req = CreateRequest(request_id="cold", image="debian", argv=["sleep", "1000"])
    async with d.client() as c:
        cold = await c.create(req)  # learns the shape
        layers = _holds(debian_store)[cold.sandbox.sandbox_id]
        deadline = time.monotonic() + 60
        while not (members := [h for h, ls in _holds(debian_store).items() if h.startswith("_warm-") and ls == layers]):
            assert time.monotonic() < deadline, "no warm member of the debian shape"
            await asyncio.sleep(0.05)
        while (pool := (await c.health()).warm_pool) is None or pool.starting or pool.ready < 2:
            assert time.monotonic() < deadline, pool  # ready: the defaults' member and this shape's
            await asyncio.sleep(0.05)
        warm = await c.create(req.model_copy(update={"request_id": "warm"}))
        assert warm.sandbox.native is not None
        member = warm.sandbox.native.cgroup_dir.rsplit("/", 1)[-1]
        assert member in members  # claimed: the one member of the shape
        holds = _holds(debian_store)
        assert holds[warm.sandbox.sandbox_id] == layers and member not in holds
        for created in (cold, warm):
            await c.delete(ref_of(created))
        assert not {cold.sandbox.sandbox_id, warm.sandbox.sandbox_id} & set(_holds(debian_store))
