"""The start-up boost (issue 16): an execd sandbox's cgroup starts without its CPU quota and gets it when execd
reports Ready, or at ``cpu_boost_seconds`` when it never does; a warm member is parked without a quota but at idle
weight, and a claimed one ends with a cold create's quota and weight. docs/resources.md, 'Start-up boost'."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from sbx_helpers import LAYOUT, Daemon, DaemonFactory, wait_until
from test_images import CACHE, debian_store  # noqa: F401 - the session's Debian image (a fixture)
from test_runtime_control import ready, until
from test_warm_store_image import _settled

from adx.images import ImageStore
from adx.sandboxd import CreateRequest, ExecdOptions, ResourcesSpec, RuntimeControlSubscription, ref_of
from adx.sandboxd._cgroups import SandboxCgroup, cpu_bandwidth

pytestmark = pytest.mark.slow

#: adx up's Environments by default: 10 millicores, 1 ms of CPU every 100 ms. execd's start-up on the Debian
#: image (its own python3: imports, asyncio) takes ~90 ms of CPU: held to this quota, seconds.
SMALL = 10
_, QUOTA, BURST = cpu_bandwidth(SMALL)
#: A bound the tests that end the boost at Ready never reach: their quota can only come from Ready.
LONG = 20.0


def _request(sandbox_id: str, python: str = "python3", image: str | None = "debian") -> CreateRequest:
    return CreateRequest(
        request_id=sandbox_id,
        sandbox_id=sandbox_id,
        image=image,
        argv=[],
        execd=ExecdOptions(python=python, execution_id=f"x-{sandbox_id}"),
        resources=ResourcesSpec(cpu_millis=SMALL, memory_bytes=256 << 20),
    )


def _cpu_dir(d: Daemon, cgroup_name: str) -> Path:
    """The directory of the CPU controller's files (a v1 hierarchy on a hybrid host, else the cgroup2 one)."""
    for path in SandboxCgroup(LAYOUT, d.cgroup_parent, cgroup_name).dirs():
        if (path / "cpu.cfs_quota_us").exists() or (path / "cpu.max").exists():
            return path
    raise AssertionError(f"no CPU controller for {cgroup_name}")


def _cpu(d: Daemon, cgroup_name: str) -> tuple[str, int]:
    """(quota, weight) as the CPU controller has them: ``cpu.max``'s quota ("max": none) and ``cpu.weight``
    (cgroup v2), or ``cpu.cfs_quota_us`` ("-1": none) and ``cpu.shares`` (v1, a hybrid host)."""
    path = _cpu_dir(d, cgroup_name)
    if (path / "cpu.cfs_quota_us").exists():
        return (path / "cpu.cfs_quota_us").read_text().strip(), int((path / "cpu.shares").read_text())
    return (path / "cpu.max").read_text().split()[0], int((path / "cpu.weight").read_text())


def _unlimited(quota: str) -> bool:
    return quota in ("max", "-1")


def _normal_weight() -> int:
    return 1024 if LAYOUT.source("cpu") == "v1" else 100


async def test_a_cold_execd_sandbox_of_a_small_quota_gets_ready_fast_then_holds_its_quota(
    sandboxd: DaemonFactory,
    debian_store: ImageStore,  # noqa: F811
) -> None:
    """Before the boost execd's start-up on the Debian image ran under 10 millicores: Ready 6-9 s after the create."""
    d = sandboxd(images_dir=str(CACHE), cpu_boost_seconds=LONG)  # only Ready can end it within the test
    async with d.client() as c:
        health = await c.health()
        assert health.runtime_control_socket is not None
        async with RuntimeControlSubscription(health.runtime_control_socket) as sub:
            t0 = time.monotonic()
            created = await c.create(_request("boost-cold"))
            await until(sub, ready("boost-cold"), seconds=30)
            took = time.monotonic() - t0
            assert took < 2.5, f"Ready {took:.2f} s after the create"
            # Ready ended the boost (sandboxd writes the quota as it sees Ready: wait for the write's thread).
            wait_until(lambda: not _unlimited(_cpu(d, "boost-cold")[0]), timeout=1.0)
            assert _cpu(d, "boost-cold") == (str(QUOTA), _normal_weight())
            await c.delete(ref_of(created))


@pytest.mark.req("SEC-3")
async def test_the_boost_ends_at_its_bound_for_an_execd_that_never_gets_ready(
    sandboxd: DaemonFactory, tmp_path: Path
) -> None:
    """An "interpreter" that spins instead of starting execd: no Ready ever; its quota comes at the bound, and
    holds it (throttled) from then on."""
    fake = tmp_path / "stuck"
    fake.mkdir()
    (fake / "python").write_text("#!/bin/sh\nwhile :; do :; done\n")
    (fake / "python").chmod(0o755)
    d = sandboxd(ro_binds={"/opt/stuck": str(fake)}, cpu_boost_seconds=1.0)
    async with d.client() as c:
        t0 = time.monotonic()
        created = await c.create(_request("boost-stuck", python="/opt/stuck/python", image=None))
        assert _unlimited(_cpu(d, "boost-stuck")[0])  # started boosted: no quota
        wait_until(lambda: not _unlimited(_cpu(d, "boost-stuck")[0]), timeout=10.0)
        took = time.monotonic() - t0
        assert 0.8 <= took <= 2.5, took  # the bound, not earlier (no Ready) and not much later
        assert _cpu(d, "boost-stuck") == (str(QUOTA), _normal_weight())
        await asyncio.sleep(0.5)
        cpu_dir = _cpu_dir(d, "boost-stuck")
        stat = dict(line.split() for line in (cpu_dir / "cpu.stat").read_text().splitlines())
        assert int(stat["nr_throttled"]) > 0, stat  # the spinner meets its quota now
        await c.delete(ref_of(created))


@pytest.mark.req("SEC-3")
async def test_a_warm_member_is_parked_at_idle_weight_and_a_claim_ends_as_a_cold_create(
    sandboxd: DaemonFactory,
    debian_store: ImageStore,  # noqa: F811
) -> None:
    d = sandboxd(images_dir=str(CACHE), warm_pool=1, cpu_boost_seconds=LONG)  # only Ready can end it in the test
    async with d.client() as c:
        health = await c.health()
        assert health.runtime_control_socket is not None
        async with RuntimeControlSubscription(health.runtime_control_socket) as sub:
            cold = await c.create(_request("boost-first"))  # learns the shape: cold
            await until(sub, ready("boost-first"), seconds=30)
            members = await _settled(c, d)
            (member,) = members
            quota, weight = _cpu(d, member)
            assert _unlimited(quota) and weight < _normal_weight() / 10, (quota, weight)  # idle priority
            t0 = time.monotonic()
            warm = await c.create(_request("boost-warm"))
            assert warm.sandbox.native is not None and Path(warm.sandbox.native.cgroup_dir).name == member
            await until(sub, ready("boost-warm"), seconds=30)
            took = time.monotonic() - t0
            assert took < 1.5, f"a claimed member Ready {took:.2f} s after the create"
            wait_until(lambda: not _unlimited(_cpu(d, member)[0]), timeout=1.0)
            assert _cpu(d, member) == _cpu(d, "boost-first") == (str(QUOTA), _normal_weight())
            for created in (cold, warm):
                await c.delete(ref_of(created))
