"""execd as PID 1 of a real sandboxd sandbox: socket reached from the host through the bind-mounted run dir,
runtime control through a ControlHub on the host.

sandboxd does not start execd by itself yet; this test passes execd as the sandbox's ``init_argv``. The
execd modules are copied into the sandbox's run dir (bind-mounted at /run/adx inside) right after create, so
PID 1 is a tiny shell that waits for them and then ``exec``s execd (same PID 1).
"""
# ruff: noqa: ASYNC240 - the test inspects host files between awaits; a blocking stat in a test is harmless

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from execd_helpers import Subscriber

from adx.execd._control_hub import ControlHub
from adx.execd._launch import init_argv, install_runtime

if os.geteuid() != 0:
    pytest.skip("sandboxes need root", allow_module_level=True)

# Read-only reuse of sandboxd's own test helpers: real daemon, unique cgroup parent, cleanup on failure.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandboxd"))
from sbx_helpers import DaemonFactory

from adx.sandboxd import CreateRequest, ResourcesSpec, ref_of

WAIT_THEN_EXEC = 'while [ ! -e /run/adx/py/ready ]; do sleep 0.005; done; exec "$@"'


@pytest.fixture
def sandboxd(tmp_path: Path) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.mark.req("CTL-1", "CTL-3")
async def test_execd_is_pid1_of_a_real_sandbox(sandboxd: DaemonFactory, short_dir: Path) -> None:
    d = sandboxd()
    hub = ControlHub(short_dir / "node.sock")
    await hub.start()
    try:
        sub, _ = await Subscriber.connect(hub.subscribe_path)
        execd = init_argv(python="/usr/bin/python3", sandbox_id="ex1", workload=["sleep", "1000"])
        async with d.client() as c:
            started = time.monotonic()
            created = await c.create(
                CreateRequest(
                    request_id="ex1",
                    sandbox_id="ex1",
                    argv=["sleep", "1000"],
                    init_argv=["/bin/sh", "-c", WAIT_THEN_EXEC, "sh", *execd],
                    env={"PYTHONPATH": "/run/adx/py", "PATH": "/usr/local/bin:/usr/bin:/bin"},
                    # The test default is 0.25 CPU, which makes interpreter start-up 4x slower than a real one.
                    resources=ResourcesSpec(cpu_millis=2000, memory_bytes=256 << 20),
                )
            )
            create_took = time.monotonic() - started
            run_dir = Path(created.sandbox.run_dir)
            await hub.add_sandbox("ex1", run_dir / "control.sock")
            install_runtime(run_dir / "py")
            (run_dir / "py" / "ready").touch()
            installed_at = time.monotonic()
            await sub.until(lambda s: s.get("ex1", {}).get("ready") is True, seconds=15)
            ready_after = time.monotonic() - started
            exec_to_ready = time.monotonic() - installed_at

            transport = httpx.AsyncHTTPTransport(uds=str(run_dir / "execd.sock"))
            async with httpx.AsyncClient(transport=transport, base_url="http://execd", timeout=10) as client:
                health = (await client.get("/v1/health")).json()
                assert health["pid"] == 1, "execd is the sandbox's PID 1"
                assert health["workload"]["state"] == "running"
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
            await sub.until(lambda s: s["ex1"]["activity"]["version"] >= 4)

            await c.delete(ref_of(created))
            await sub.until(lambda s: "ex1" not in s, seconds=15)
        sub.close()
        print(
            f"sandbox create -> execd Ready {ready_after * 1000:.0f} ms (create call {create_took * 1000:.0f} ms, "
            f"execd modules in place -> Ready {exec_to_ready * 1000:.0f} ms)"
        )
    finally:
        await hub.stop()


@pytest.mark.slow
@pytest.mark.req("CTL-2", "CTL-3")
async def test_fifty_real_sandboxes_one_subscription(sandboxd: DaemonFactory, short_dir: Path) -> None:
    """50 sandboxes, each with execd as PID 1: one snapshot with all 50, then only the touched one's deltas;
    a deleted sandbox's observation is cleared; a new subscription starts with a fresh full snapshot."""
    count = 50
    d = sandboxd()
    hub = ControlHub(short_dir / "node.sock")
    await hub.start()
    try:
        async with d.client() as c:
            refs = {}

            async def create(i: int) -> Path:
                sid = f"ex{i:02d}"
                execd = init_argv(python="/usr/bin/python3", sandbox_id=sid)
                created = await c.create(
                    CreateRequest(
                        request_id=sid,
                        sandbox_id=sid,
                        argv=["sleep", "1000"],
                        init_argv=["/bin/sh", "-c", WAIT_THEN_EXEC, "sh", *execd],
                        env={"PYTHONPATH": "/run/adx/py", "PATH": "/usr/local/bin:/usr/bin:/bin"},
                        resources=ResourcesSpec(memory_bytes=64 << 20),
                    )
                )
                refs[sid] = ref_of(created)
                run_dir = Path(created.sandbox.run_dir)
                await hub.add_sandbox(sid, run_dir / "control.sock")
                install_runtime(run_dir / "py")
                (run_dir / "py" / "ready").touch()
                return run_dir

            run_dirs = await asyncio.gather(*(create(i) for i in range(count)))
            async with asyncio.timeout(60):
                while sum(1 for s in hub.snapshot().values() if s["ready"]) < count:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)

            sub, snapshot = await Subscriber.connect(hub.subscribe_path)
            assert len(snapshot["sandboxes"]) == count, "one snapshot with all 50"
            assert all(state["ready"] for state in snapshot["sandboxes"].values())

            transport = httpx.AsyncHTTPTransport(uds=str(run_dirs[7] / "execd.sock"))
            async with httpx.AsyncClient(transport=transport, base_url="http://execd", timeout=10) as client:
                for _ in range(3):
                    assert (await client.post("/v1/commands", json={"argv": ["true"]})).status_code == 200
            await sub.until(lambda s: s["ex07"]["activity"]["version"] == 6)
            with pytest.raises(TimeoutError):
                await sub.next(seconds=0.3)
            assert {m["sandboxId"] for m in sub.deltas} == {"ex07"}, "only the touched sandbox's deltas"
            assert len(sub.deltas) < 6, "six version bumps are coalesced"

            await c.delete(refs["ex09"])
            await sub.until(lambda s: "ex09" not in s, seconds=15)
            assert sub.deltas[-1]["sandboxId"] == "ex09" and sub.deltas[-1]["state"] is None
            sub.close()

            sub2, snapshot2 = await Subscriber.connect(hub.subscribe_path)
            assert sorted(snapshot2["sandboxes"]) == sorted(f"ex{i:02d}" for i in range(count) if i != 9)
            assert snapshot2["sandboxes"]["ex07"]["activity"]["version"] == 6
            sub2.close()
    finally:
        await hub.stop()
