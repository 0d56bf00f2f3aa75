"""The sandboxd RuntimeDriver's ``reclaim``: what a node whose execution file was lost does with an execution its
runtime inventory still lists — on a real sandboxd with execd as PID 1. This is the runtime half of NOD-1/NOD-18's
"adopt or clean what the inventory holds"; the node's recovery using it is proven by the node's own tests."""

from __future__ import annotations

import secrets
from dataclasses import replace

import pytest
from sbx_helpers import Daemon, DaemonFactory

from adx.errors import ConflictError, InvalidInputError, NotFoundError, UncertainOutcomeError
from adx.model import EnvironmentSpec, Resources
from adx.runtime import Execution, ExecutionSpec, ExecutionState, InventoryItem
from adx.runtime._sandboxd import ExecdReadiness, SandboxdDriver
from adx.sandboxd import PermissionDeniedError
from adx.sandboxd._spawn_client import FAULTS_ENV

PY = "/usr/bin/python3"
SPEC = EnvironmentSpec(resources=Resources(cpu_millis=250, memory_bytes=128 << 20), entrypoint=["sleep", "1000"])


async def _lost_execution(driver: SandboxdDriver, env_id: str, execution_id: str) -> tuple[Execution, InventoryItem]:
    """Start an execution, then find it the way a node's startup recovery does: by inventory alone."""
    started = await driver.start(ExecutionSpec(env_id, 1, execution_id, SPEC))
    item = next(i for i in await driver.inventory() if i.execution_id == execution_id)
    assert (item.env_id, item.generation, item.state) == (env_id, 1, ExecutionState.RUNNING)
    assert "token" not in item.native  # the inventory never hands out secrets
    return started, item


@pytest.mark.req("SBX-4", "SBX-6")
async def test_reclaim_makes_an_inventory_item_addressable_and_voids_the_lost_secret(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    driver = SandboxdDriver(d.socket, python=PY)
    try:
        idle = (await driver.client.resource()).reserved
        lost, item = await _lost_execution(driver, "env-1", "exec-1")
        await ExecdReadiness(driver).wait_ready(lost, 30)
        secret = secrets.token_urlsafe(32)
        execution = await driver.reclaim(item, secret)
        # The same shape start returns: the node saves it and addresses the execution again.
        assert (execution.env_id, execution.generation, execution.execution_id) == ("env-1", 1, "exec-1")
        assert execution.native == {**lost.native, "token": secret}
        assert execution.execd_socket == lost.execd_socket
        assert await driver.observe(execution) == ExecutionState.RUNNING
        await ExecdReadiness(driver).wait_ready(execution, 30)  # execd itself was never touched
        # Whoever still holds the lost secret can do nothing; it is never read as "missing" (SBX-6).
        assert await driver.observe(lost) == ExecutionState.UNKNOWN
        with pytest.raises(PermissionDeniedError):
            await driver.stop(lost)
        # A retry with the same secret (an uncertain first call) returns the same address.
        assert await driver.reclaim(item, secret) == execution
        # Refusals: a malformed secret, a stale generation.
        with pytest.raises(InvalidInputError, match="secret: ") as bad:
            await driver.reclaim(item, "too-short")
        assert bad.value.field == "secret"
        with pytest.raises(ConflictError, match="generation"):
            await driver.reclaim(replace(item, generation=2), secrets.token_urlsafe(32))
        # The reclaimed execution is then cleaned like any other: nothing is left, nothing stays reserved.
        await driver.stop(execution)
        assert await driver.inventory() == []
        assert await driver.observe(execution) == ExecutionState.MISSING
        assert (await driver.client.resource()).reserved == idle
        with pytest.raises(NotFoundError, match="tombstoned"):
            await driver.reclaim(item, secrets.token_urlsafe(32))
    finally:
        await driver.aclose()


async def _restart(d: Daemon) -> None:
    assert d.proc is not None and d.proc.wait(10) == -9  # the fault point SIGKILLed it
    d.start()


@pytest.mark.req("SBX-6", "SBX-2")
async def test_a_reclaim_cut_short_by_a_sandboxd_sigkill_converges_on_retry(sandboxd: DaemonFactory) -> None:
    d = sandboxd(start=False)
    d.start(env={FAULTS_ENV: "reclaim.after_persist"})
    driver = SandboxdDriver(d.socket, python=PY)
    try:
        lost, item = await _lost_execution(driver, "env-2", "exec-2")
        secret = secrets.token_urlsafe(32)
        with pytest.raises(UncertainOutcomeError):
            await driver.reclaim(item, secret)
        await _restart(d)
        execution = await driver.reclaim(item, secret)  # the node's retry, same secret
        assert execution.native["token"] == secret
        assert await driver.observe(execution) == ExecutionState.RUNNING
        assert await driver.observe(lost) == ExecutionState.UNKNOWN
        await driver.stop(execution)
        assert await driver.inventory() == []
    finally:
        await driver.aclose()
