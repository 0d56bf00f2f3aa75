"""execd as PID 1 of real sandboxd sandboxes, started the supported way: ``CreateRequest.execd``.

sandboxd builds execd's command line, mounts its execd runtime at /opt/adx, binds execd's sockets at host-only
paths (socket activation) and aggregates every execd's reports into its node-level runtime-control
subscription, read here with ``adx.sandboxd.RuntimeControlSubscription``.
"""
# ruff: noqa: ASYNC240 - the test inspects host files between awaits; a blocking stat in a test is harmless

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adx._fs import ShortUnixPath

if os.geteuid() != 0:
    pytest.skip("sandboxes need root", allow_module_level=True)

from sbx_helpers import DaemonFactory

from adx.sandboxd import CreateRequest, ExecdOptions, ResourcesSpec, RuntimeControlSubscription, ref_of

STEP = 30.0


@pytest.fixture
def sandboxd(tmp_path: Path) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.cleanup()


def client_for(socket: str) -> httpx.AsyncClient:
    path = ShortUnixPath(Path(socket)).path  # short test paths pass through unchanged
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path), base_url="http://execd", timeout=10)


@pytest.mark.req("CTL-1", "CTL-3")
async def test_execd_is_pid1_of_a_real_sandbox(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        health = await c.health()
        assert health.runtime_control_socket is not None
        async with RuntimeControlSubscription(health.runtime_control_socket) as sub:
            await sub.wait_connected(STEP)
            started = time.monotonic()
            created = await c.create(
                CreateRequest(
                    request_id="ex1",
                    sandbox_id="ex1",
                    argv=["sleep", "1000"],
                    execd=ExecdOptions(python="/usr/bin/python3"),
                    # The test default is 0.25 CPU, which makes interpreter start-up 4x slower than a real one.
                    resources=ResourcesSpec(cpu_millis=2000, memory_bytes=256 << 20),
                )
            )
            create_took = time.monotonic() - started
            async with asyncio.timeout(STEP):
                while not (sub.states.get("ex1") and sub.states["ex1"].ready):
                    await sub.next_event()
            ready_after = time.monotonic() - started
            socket = created.sandbox.execd_socket
            assert socket is not None

            async with client_for(socket) as client:
                health_doc = (await client.get("/v1/health")).json()
                assert health_doc["pid"] == 1, "execd is the sandbox's PID 1"
                assert health_doc["workload"]["state"] == "running"
                resp = await client.post(
                    "/v1/commands", json={"command": "echo ${PYTHONPATH-unset}; cat /proc/1/cmdline"}
                )
                lines = [json.loads(line) for line in resp.text.splitlines()]
                out = "".join(f["data"] for f in lines if f.get("stream") == "stdout")
                assert lines[-1]["exitCode"] == 0
                assert out.startswith("unset\n"), "execd's PYTHONPATH is not the commands' business"
                assert "adx.execd" in out, "PID 1 is execd"
                put = await client.put("/v1/files", params={"path": "/work/from-host.txt"}, content=b"hello")
                assert put.status_code == 201
            assert (d.sandbox_dir("ex1") / "upper" / "work" / "from-host.txt").read_bytes() == b"hello", (
                "the write landed in the sandbox's own upper layer"
            )
            assert not Path("/work/from-host.txt").exists()
            async with asyncio.timeout(STEP):
                while sub.states["ex1"].activity.version < 4:
                    await sub.next_event()

            await c.delete(ref_of(created))
            async with asyncio.timeout(STEP):
                while (event := await sub.next_event()).sandbox_id != "ex1" or event.state is not None:
                    pass
    print(f"sandbox create -> execd Ready {ready_after * 1000:.0f} ms (create call {create_took * 1000:.0f} ms)")


@pytest.mark.slow
@pytest.mark.req("CTL-2", "CTL-3")
async def test_fifty_real_sandboxes_one_subscription(sandboxd: DaemonFactory) -> None:
    """50 sandboxes, each with execd as PID 1: one snapshot with all 50, then only the touched one's deltas;
    a deleted sandbox's observation is cleared; a new subscription starts with a fresh full snapshot."""
    count = 50
    d = sandboxd()
    async with d.client() as c:
        path = (await c.health()).runtime_control_socket
        assert path is not None
        refs = {}
        sockets = {}

        async def create(i: int) -> None:
            sid = f"ex{i:02d}"
            created = await c.create(
                CreateRequest(
                    request_id=sid,
                    sandbox_id=sid,
                    execd=ExecdOptions(python="/usr/bin/python3"),
                    resources=ResourcesSpec(memory_bytes=64 << 20),
                )
            )
            refs[sid] = ref_of(created)
            sockets[sid] = created.sandbox.execd_socket

        await asyncio.gather(*(create(i) for i in range(count)))
        async with RuntimeControlSubscription(path) as sub:
            async with asyncio.timeout(90):
                while sum(1 for s in sub.states.values() if s.ready) < count:
                    await sub.next_event()

        async with RuntimeControlSubscription(path) as sub:
            snapshot = await sub.next_event(STEP)
            assert snapshot.kind == "snapshot" and len(snapshot.sandboxes) == count, "one snapshot with all 50"
            assert all(state.ready for state in snapshot.sandboxes.values())

            socket = sockets["ex07"]
            assert socket is not None
            async with client_for(socket) as client:
                for _ in range(3):
                    assert (await client.post("/v1/commands", json={"argv": ["true"]})).status_code == 200
            deltas = []
            async with asyncio.timeout(STEP):
                while not deltas or deltas[-1].state is None or deltas[-1].state.activity.version != 6:
                    deltas.append(await sub.next_event())
            with pytest.raises(TimeoutError):
                await sub.next_event(0.3)
            assert {e.sandbox_id for e in deltas} == {"ex07"}, "only the touched sandbox's deltas"
            assert len(deltas) < 6, "six version bumps are coalesced"

            await c.delete(refs["ex09"])
            async with asyncio.timeout(STEP):  # ``states`` is current at once; the events follow in order
                while (event := await sub.next_event()).sandbox_id != "ex09":
                    pass
            assert event.kind == "delta" and event.state is None and "ex09" not in sub.states

        async with RuntimeControlSubscription(path) as sub2:
            snapshot2 = await sub2.next_event(STEP)
            assert sorted(snapshot2.sandboxes) == sorted(f"ex{i:02d}" for i in range(count) if i != 9)
            assert snapshot2.sandboxes["ex07"].activity.version == 6
