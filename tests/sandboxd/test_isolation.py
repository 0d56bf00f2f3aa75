"""Isolation of process sandboxes: namespaces, copy-on-write root, limits, whole-tree kill on delete."""
# ruff: noqa: ASYNC240 - the tests inspect host files between awaits; a blocking stat in a test is harmless

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory, wait_until

from adx.sandboxd import CreateRequest, ResourcesSpec, State, ref_of
from adx.sandboxd._confinement import KEEP_CAPABILITIES

PROBE = r"""
import os, json
out = {
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "shadow": os.path.exists("/etc/shadow"),
    "root_home": os.listdir("/root"),
    "state_dir_visible": os.path.exists(os.environ["STATE_DIR"]),
    "hostname": os.uname().nodename,
    "top": sorted(os.listdir("/")),
    "interfaces": sorted(name for _, name in __import__("socket").if_nameindex()),
    "cap_eff": int([l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1], 16),
    "cap_bnd": int([l for l in open("/proc/self/status") if l.startswith("CapBnd")][0].split()[1], 16),
}
try:
    with open("/proc/sys/kernel/core_pattern", "w") as fh:
        fh.write("|/bin/false")
    out["core_pattern_writable"] = True
except OSError as exc:
    out["core_pattern_writable"] = exc.strerror
out["kallsyms"] = open("/proc/kallsyms").read()
import ctypes, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def errno_of(*args):
    return 0 if libc.syscall(*args) >= 0 else ctypes.get_errno()
out["unshare_userns"] = errno_of(272, 0x10000000)       # EPERM expected
out["keyctl"] = errno_of(250, 0, 0, 0, 0, 0)             # KEYCTL_GET_KEYRING_ID: EPERM expected
out["subprocess"] = subprocess.run(["echo", "ok"], capture_output=True, text=True).stdout.strip()
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["threads"] = True
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    out["mount"] = libc.mount(b"tmpfs", b"/mnt", b"tmpfs", 0, None) == 0
except Exception as exc:
    out["mount"] = repr(exc)
for path in ("/work/hello.txt", "/etc/adx-probe", "/opt/new/file"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("from the sandbox\n")
try:
    open("/usr/adx-probe", "w")
    out["usr_writable"] = True
except OSError as exc:
    out["usr_writable"] = exc.strerror
print(json.dumps(out), flush=True)
"""


@pytest.mark.req("SEC-3", "SBX-5")
async def test_sandbox_sees_no_host_processes_and_writes_land_in_its_upper_layer(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(
            CreateRequest(request_id="iso", argv=["python3", "-c", PROBE], env={"STATE_DIR": str(d.state_dir)})
        )
        done = await c.wait(ref_of(created), timeout_seconds=20)
        assert done.done and done.sandbox.state == State.TERMINATED
        assert done.sandbox.exit is not None and done.sandbox.exit.exit_code == 0, d.log()
        sid = created.sandbox.sandbox_id
        import json

        out = json.loads((d.sandbox_dir(sid) / "output.log").read_text().strip().splitlines()[-1])
        assert out["pids"] == [1], "only the sandbox's own PID 1 is visible"
        assert out["shadow"] is False and out["root_home"] == [] and out["state_dir_visible"] is False
        assert out["hostname"] == sid
        assert out["usr_writable"] == "Read-only file system"
        assert out["interfaces"] == ["lo"], "a private network namespace by default"
        assert not out["cap_eff"] & (1 << 21), "CAP_SYS_ADMIN is dropped"
        # Shrunk by the supervisor before the clone (network none): exactly the kept set.
        assert out["cap_bnd"] == sum(1 << cap for cap in KEEP_CAPABILITIES)
        assert out["mount"] is False
        assert out["unshare_userns"] == 1 and out["keyctl"] == 1  # EPERM from the seccomp filter
        assert out["subprocess"] == "ok" and out["threads"]  # clone3 -> ENOSYS -> libc falls back to clone
        assert out["core_pattern_writable"] == "Read-only file system" and out["kallsyms"] == ""
        upper = d.sandbox_dir(sid) / "upper"
        assert (upper / "work/hello.txt").read_text() == "from the sandbox\n"
        assert (upper / "etc/adx-probe").exists() and (upper / "opt/new/file").exists()
        assert not Path("/etc/adx-probe").exists() and not Path("/opt/new").exists()
        assert not Path("/work/hello.txt").exists()
        # Identity is bound to this boot and the cgroup's inode (SBX-5).
        native = created.sandbox.native
        assert native is not None
        assert native.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        await c.delete(ref_of(created))


@pytest.mark.req("SEC-3")
async def test_memory_limit_oom_kills_and_wait_reports_it(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(
            CreateRequest(
                request_id="oom",
                argv=["python3", "-c", "x = b'a' * (256 << 20); print('survived', flush=True)"],
                resources=ResourcesSpec(memory_bytes=48 << 20),
            )
        )
        done = await c.wait(ref_of(created), timeout_seconds=30)
        assert done.done and done.sandbox.state == State.TERMINATED
        assert done.sandbox.exit is not None
        assert done.sandbox.exit.signal == 9 and done.sandbox.exit.oom_killed, done.sandbox.exit
        assert "survived" not in (d.sandbox_dir(created.sandbox.sandbox_id) / "output.log").read_text()
        await c.delete(ref_of(created))


FORK_BOMB = r"""
import os, time
n = 0
for _ in range(64):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
print("forked", n, flush=True)
time.sleep(60)
"""


@pytest.mark.req("SEC-3")
async def test_pids_limit_holds(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(
            CreateRequest(request_id="pids", argv=["python3", "-c", FORK_BOMB], resources=ResourcesSpec(pids_max=12))
        )
        log = d.sandbox_dir(created.sandbox.sandbox_id) / "output.log"
        line = wait_until(lambda: "forked" in log.read_text() and log.read_text(), timeout=20)
        forked = int(line.split()[1])
        assert 1 <= forked < 12
        stats = await c.stats(ref_of(created))
        assert stats.pids <= 12
        assert stats.memory_bytes > 0 and stats.cpu_usage_ns > 0
        await c.delete(ref_of(created))


@pytest.mark.req("SBX-7", "SBX-12")
async def test_double_forked_daemon_dies_on_delete_and_the_id_is_never_reused(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(
            CreateRequest(
                request_id="df",
                sandbox_id="double-fork",
                # The inner shell double-forks a sleeper into its own session, then the init itself sleeps.
                argv=["/bin/sh", "-c", "(setsid sleep 1000 &) ; sleep 1000"],
            )
        )
        sid = created.sandbox.sandbox_id
        procs = d.settled_procs(sid)
        res = await c.resource()
        assert res.reserved.memory_bytes == created.sandbox.resources.memory_bytes
        started = time.monotonic()
        await c.delete(ref_of(created))
        assert time.monotonic() - started < 5
        for pid in procs:
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
        assert not d.v2_cgroup(sid).exists()
        sdir = d.sandbox_dir(sid)
        assert sorted(os.listdir(sdir)) == ["lifecycle.lock", "tombstone.json"]
        assert (await c.resource()).reserved.memory_bytes == 0
        with pytest.raises(Exception) as info:
            await c.create(CreateRequest(request_id="df2", sandbox_id="double-fork", argv=["true"]))
        assert "never reused" in str(info.value)


@pytest.mark.req("SEC-3")
async def test_configured_read_only_binds_are_visible_and_read_only(sandboxd: DaemonFactory, tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "tool.txt").write_text("shared tool\n")
    d = sandboxd(ro_binds={"/opt/adx": str(runtime)})
    script = "cat /opt/adx/tool.txt; touch /opt/adx/x 2>/dev/null && echo writable || echo read-only"
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="ro", argv=["/bin/sh", "-c", script]))
        done = await c.wait(ref_of(created), timeout_seconds=20)
        assert done.sandbox.exit is not None and done.sandbox.exit.exit_code == 0
        out = (d.sandbox_dir(created.sandbox.sandbox_id) / "output.log").read_text()
        assert out == "shared tool\nread-only\n"
        assert sorted(os.listdir(runtime)) == ["tool.txt"]
        await c.delete(ref_of(created))


@pytest.mark.req("SEC-3")
async def test_veth_network_gives_a_private_address_reachable_from_the_host(sandboxd: DaemonFactory) -> None:
    import httpx

    d = sandboxd()
    server = ["/bin/sh", "-c", "echo served > /work/index.txt; exec python3 -m http.server 8765 -d /work"]
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="net", argv=server, network="veth"))
        info = created.sandbox
        assert info.network == "veth" and info.address and info.host_address
        other = await c.create(CreateRequest(request_id="net2", argv=["sleep", "1000"], network="veth"))
        assert other.sandbox.address != info.address  # one private /30 each
        # With veth the supervisor keeps its bounding set (it runs `ip`); the init shrinks its own.
        (init_pid,) = d.cgroup_procs(other.sandbox.sandbox_id)
        status = Path(f"/proc/{init_pid}/status").read_text()
        cap_bnd = int(next(line for line in status.splitlines() if line.startswith("CapBnd")).split()[1], 16)
        assert cap_bnd == sum(1 << cap for cap in KEEP_CAPABILITIES)

        async def fetch() -> str:
            async with httpx.AsyncClient(timeout=2.0) as http:
                for _ in range(400):  # the server starts a Python interpreter: allow for a loaded host
                    try:
                        return (await http.get(f"http://{info.address}:8765/index.txt")).text
                    except httpx.TransportError:
                        await asyncio.sleep(0.05)
            raise AssertionError("the sandbox's server never answered on its address")

        assert await fetch() == "served\n"
        await c.delete(ref_of(created))
        await c.delete(ref_of(other))
        # The host end of the pair goes away with the sandbox's namespace.
        wait_until(
            lambda: info.host_address not in subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
        )
