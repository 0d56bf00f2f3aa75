"""sandboxd <-> execd on real sandboxes: execd as PID 1 through ``CreateRequest.execd``, its sockets bound by
the supervisor at host-only paths (socket activation), and the node-level runtime-control subscription
(sandboxd's ControlHub) read through the typed client ``RuntimeControlSubscription``.
"""
# ruff: noqa: ASYNC240 - the tests inspect host files between awaits; a blocking stat in a test is harmless

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sbx_helpers import Daemon, DaemonFactory

from adx._fs import ShortUnixPath
from adx.errors import NotFoundError, UnavailableError
from adx.sandboxd import (
    CreateRequest,
    CreateResponse,
    ExecdOptions,
    ProbeOptions,
    ResourcesSpec,
    RuntimeControlSubscription,
    RuntimeObservation,
    SandboxdClient,
    ref_of,
)

STEP = 20.0  # every wait is bounded; interpreter start-up under load takes a while
PY = "/usr/bin/python3"


def execd_request(sandbox_id: str, argv: list[str] | None = None, **execd: Any) -> CreateRequest:
    return CreateRequest(
        request_id=sandbox_id,
        sandbox_id=sandbox_id,
        argv=argv or [],
        execd=ExecdOptions(python=PY, execution_id=f"x-{sandbox_id}", **execd),
        # The test default of 0.25 CPU makes interpreter start-up 4x slower than a real one.
        resources=ResourcesSpec(cpu_millis=1000, memory_bytes=128 << 20),
    )


async def execd_call(socket: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    with ShortUnixPath(Path(socket)) as uds:
        transport = httpx.AsyncHTTPTransport(uds=uds)
        async with httpx.AsyncClient(transport=transport, base_url="http://execd", timeout=STEP) as client:
            return await client.request(method, path, **kwargs)


async def run(socket: str, command: str) -> tuple[str, int]:
    resp = await execd_call(socket, "POST", "/v1/commands", json={"command": command})
    assert resp.status_code == 200, resp.text
    frames = [json.loads(line) for line in resp.text.splitlines() if line]
    return "".join(f["data"] for f in frames if f.get("stream") == "stdout"), frames[-1]["exitCode"]


async def until(
    sub: RuntimeControlSubscription, predicate: Callable[[dict[str, RuntimeObservation]], bool], seconds: float = STEP
) -> None:
    """Consume events until ``predicate(sub.states)`` holds."""
    async with asyncio.timeout(seconds):
        while not predicate(sub.states):
            await sub.next_event()


def ready(*ids: str) -> Callable[[dict[str, RuntimeObservation]], bool]:
    return lambda s: all(i in s and s[i].ready for i in ids)


def init_host_pid(daemon: Daemon, sandbox_id: str) -> int:
    """The host PID of the sandbox's PID 1 (NSpid ends in 1)."""
    for pid in daemon.cgroup_procs(sandbox_id):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:") and line.split()[-1] == "1":
                return pid
    raise AssertionError(f"no PID 1 in {sandbox_id}")


def break_control_connection(pid: int) -> None:
    """Shut down execd's control connection from outside while execd lives: duplicate its socket with
    ``pidfd_getfd`` (the one whose peer is the hub's control.sock) and ``shutdown`` it (shared by both fds)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    found = 0
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            # execd opens and closes fds of its own meanwhile: one listed a moment ago may be gone (fresh-ci
            # failed once on that readlink); the control socket lives throughout, so skipping it is safe.
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except FileNotFoundError:
                continue
            fd = libc.syscall(438, pidfd, int(name), 0)  # pidfd_getfd
            if fd < 0:
                if ctypes.get_errno() == errno.EBADF:  # closed since the readlink
                    continue
                raise OSError(ctypes.get_errno(), "pidfd_getfd")
            with socket.socket(fileno=fd) as sock:
                try:
                    peer = str(sock.getpeername() or "")
                except OSError:  # a listener
                    continue
                if "control.sock" in peer:
                    sock.shutdown(socket.SHUT_RDWR)
                    found += 1
    finally:
        os.close(pidfd)
    assert found == 1, f"expected one control connection in execd {pid}, found {found}"


async def subscription(daemon: Daemon, c: SandboxdClient) -> RuntimeControlSubscription:
    health = await c.health()
    assert health.runtime_control_socket is not None
    sub = RuntimeControlSubscription(health.runtime_control_socket, max_backoff=0.2)
    sub.start()
    await sub.wait_connected(STEP)
    return sub


@pytest.mark.req("CTL-1", "SEC-5", "SEC-3")
async def test_execd_is_pid1_on_a_host_only_socket_a_planted_symlink_redirects_nothing(
    sandboxd: DaemonFactory,
) -> None:
    d = sandboxd()
    async with d.client() as c:
        sub = await subscription(d, c)
        try:
            created = await c.create(execd_request("ex1", ["sleep", "1000"]))
            info = created.sandbox
            assert info.execd_socket is not None and info.execd_admin_socket is not None
            sockets = Path(info.execd_socket).parent
            # Host-only: inside the private state dir, not the run dir that is mounted into the sandbox.
            assert sockets.parent == d.sandbox_dir("ex1") and not sockets.is_relative_to(info.run_dir)
            assert stat.S_IMODE(os.lstat(sockets).st_mode) == 0o700
            for path in (info.execd_socket, info.execd_admin_socket):
                st = os.lstat(path)
                assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
            assert info.init_argv[:3] == [PY, "-m", "adx.execd"] and "--socket-fd" in info.init_argv
            await until(sub, ready("ex1"))

            health = (await execd_call(info.execd_socket, "GET", "/v1/health")).json()
            assert health["pid"] == 1 and health["workload"]["state"] == "running"
            assert health["controlConnected"] is True
            out, code = await run(info.execd_socket, "echo ${PYTHONPATH-unset}; tr '\\0' ' ' </proc/1/cmdline")
            assert code == 0 and out.startswith("unset\n") and "adx.execd --socket-fd 3" in out

            # The sandbox plants symlinks where a host client might look: in /run/adx (= run_dir), and at the
            # very host path of execd's socket (which does not exist inside: the state dir is not mounted).
            # The target is sandboxd's own API socket, which a root client would otherwise pass SO_PEERCRED on.
            before = os.lstat(info.execd_socket)
            plant = (
                f"ln -s {d.socket} /run/adx/execd.sock; ln -s {d.socket} /run/adx/execd-admin.sock; "
                f"test -e {info.execd_socket} && echo VISIBLE; "
                f"mkdir -p {sockets} && rm -f {info.execd_socket} && ln -s {d.socket} {info.execd_socket} && echo OWN; "
                "rm -f /run/adx-control/control.sock 2>/dev/null || echo CONTROL-RO; "
                "ln -s /x /run/adx-control/evil 2>/dev/null || echo CONTROL-RO"
            )
            out, _ = await run(info.execd_socket, plant)
            assert "VISIBLE" not in out, "the host socket path is not reachable from inside"
            assert "OWN" in out, "what the sandbox made at that path lives in its own root only"
            assert out.count("CONTROL-RO") == 2, "the control socket's dir is read-only inside"
            assert Path(info.run_dir, "execd.sock").is_symlink(), "the plant landed in run_dir on the host"
            after = os.lstat(info.execd_socket)
            assert stat.S_ISSOCK(after.st_mode) and (after.st_ino, after.st_dev) == (before.st_ino, before.st_dev)
            # Host clients use SandboxInfo.execd_socket: still execd, never sandboxd's API.
            assert (await execd_call(info.execd_socket, "GET", "/v1/health")).json()["pid"] == 1
            activity = (await execd_call(info.execd_admin_socket, "GET", "/v1/activity")).json()
            assert set(activity) == {"version", "active", "backgroundRunning", "admissionOpen"}
            # The hub's control link still works (the plant could not replace it): activity arrives.
            version = activity["version"]
            await until(sub, lambda s: s["ex1"].activity.version >= version)

            await c.delete(ref_of(created))
            await until(sub, lambda s: "ex1" not in s)
            assert not d.sandbox_dir("ex1").joinpath("sockets").exists(), "reclaim removed the sockets"
        finally:
            await sub.close()


@pytest.mark.req("CTL-1", "CTL-2", "RST-6", "CTL-7")
async def test_subscription_snapshot_of_real_sandboxes_then_coalesced_deltas(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    count = 4
    async with d.client() as c:
        created = await asyncio.gather(*(c.create(execd_request(f"s{i}", ["sleep", "1000"])) for i in range(count)))
        probed = await c.create(
            execd_request(
                "probe", probe=ProbeOptions(command="test -e /tmp/healthy", interval_seconds=0.1, timeout_seconds=2)
            )
        )
        sub = await subscription(d, c)
        try:
            ids = [f"s{i}" for i in range(count)]
            await until(sub, ready(*ids))
            # A fresh subscriber: ONE snapshot with every sandbox, then only deltas.
            sub2 = await subscription(d, c)
            try:
                event = await sub2.next_event(STEP)
                assert event.kind == "snapshot" and set(ids) <= set(event.sandboxes)
                assert all(event.sandboxes[i].ready for i in ids)

                # CTL-1: explicit probe failures are pushed; Ready waits for the first healthy probe.
                await until(sub2, lambda s: "probe" in s and (s["probe"].probe or None) is not None)
                await until(sub2, lambda s: s["probe"].probe is not None and s["probe"].probe.consecutive_failures >= 2)
                state = sub2.states["probe"]
                assert state.ready is False and state.probe is not None and state.probe.ok is False
                assert "exited with 1" in (state.probe.reason or "")
                assert probed.sandbox.execd_socket is not None
                await run(probed.sandbox.execd_socket, "touch /tmp/healthy")
                await until(sub2, lambda s: s["probe"].ready and s["probe"].probe is not None and s["probe"].probe.ok)

                # Activity of one sandbox: only its deltas, coalesced, ending at execd's own version.
                await asyncio.sleep(0.3)
                while not sub2._events.empty():
                    sub2._events.get_nowait()
                target = created[1].sandbox
                assert target.execd_socket is not None and target.execd_admin_socket is not None
                for _ in range(5):
                    assert (await run(target.execd_socket, "true"))[1] == 0
                version = (await execd_call(target.execd_admin_socket, "GET", "/v1/activity")).json()["version"]
                deltas = []
                async with asyncio.timeout(STEP):  # ``states`` is current at once; the events follow in order
                    while not deltas or deltas[-1].state is None or deltas[-1].state.activity.version != version:
                        deltas.append(await sub2.next_event())
                with pytest.raises(TimeoutError):
                    extra = await sub2.next_event(0.4)
                    raise AssertionError(f"unexpected event {extra} after {deltas}")
                assert {e.sandbox_id for e in deltas} == {"s1"}, "only the touched sandbox's deltas"
                assert all(e.kind == "delta" for e in deltas)
                assert len(deltas) < 10, "10 activity changes are coalesced"

                # CTL-1/CTL-7: a workload checkpoint request with its operation ID; acked through the stream.
                for _ in range(2):
                    resp = await execd_call(
                        target.execd_socket, "POST", "/v1/checkpoint-requests", json={"operationId": "op-7"}
                    )
                    assert resp.status_code == 202
                await until(sub2, lambda s: [r.operation_id for r in s["s1"].checkpoint_requests] == ["op-7"])
                await sub2.ack_checkpoint("s1", "op-7")
                await until(sub2, lambda s: s["s1"].checkpoint_requests == [])
            finally:
                await sub2.close()
        finally:
            await sub.close()


@pytest.mark.req("CTL-3")
async def test_a_lost_execd_connection_clears_its_observation_and_a_resubscribe_gets_a_fresh_snapshot(
    sandboxd: DaemonFactory,
) -> None:
    d = sandboxd()
    async with d.client() as c:
        await asyncio.gather(*(c.create(execd_request(f"k{i}", ["sleep", "1000"])) for i in range(3)))
        sub = await subscription(d, c)
        try:
            await until(sub, ready("k0", "k1", "k2"))
            # execd lives, its control connection breaks: the observation is cleared, then execd reconnects
            # by itself and its hello restores the full state (a pending checkpoint request included, CTL-7).
            k0 = next(s for s in await c.list() if s.sandbox_id == "k0")  # the three creates race: any order
            assert k0.execd_socket is not None
            resp = await execd_call(k0.execd_socket, "POST", "/v1/checkpoint-requests", json={"operationId": "op-9"})
            assert resp.status_code == 202
            await until(sub, lambda s: [r.operation_id for r in s["k0"].checkpoint_requests] == ["op-9"])
            while not sub._events.empty():
                sub._events.get_nowait()
            pid0 = init_host_pid(d, "k0")
            break_control_connection(pid0)
            event = await sub.next_event(STEP)
            assert (event.kind, event.sandbox_id, event.state) == ("delta", "k0", None), event
            assert "k0" not in sub.states
            event = await sub.next_event(STEP)
            assert event.kind == "delta" and event.sandbox_id == "k0" and event.state is not None
            assert event.state.ready and [r.operation_id for r in event.state.checkpoint_requests] == ["op-9"]
            assert init_host_pid(d, "k0") == pid0, "the same execd reconnected"

            os.kill(init_host_pid(d, "k1"), signal.SIGKILL)  # execd (PID 1) and with it its control connection
            event = await sub.next_event(STEP)
            while event.kind != "delta" or event.sandbox_id != "k1":
                assert event.sandbox_id in (None, "k0", "k2") and event.state is not None
                event = await sub.next_event(STEP)
            assert event.state is None, "the lost connection clears k1's observation (null delta)"
            assert set(sub.states) >= {"k0", "k2"} and "k1" not in sub.states
        finally:
            await sub.close()
        sub2 = await subscription(d, c)
        try:
            first = await sub2.next_event(STEP)
            assert first.kind == "snapshot" and set(first.sandboxes) == {"k0", "k2"}
            assert first.sandboxes["k0"].checkpoint_requests[0].operation_id == "op-9"
        finally:
            await sub2.close()


@pytest.mark.slow
@pytest.mark.req("SBX-11", "CTL-3")
async def test_sigkill_sandboxd_execd_reconnects_to_the_new_hub_and_the_stream_shows_them_again(
    sandboxd: DaemonFactory,
) -> None:
    d = sandboxd()
    async with d.client() as c:
        made: list[CreateResponse] = list(
            await asyncio.gather(*(c.create(execd_request(f"r{i}", ["sleep", "1000"])) for i in range(3)))
        )
        sub = await subscription(d, c)
        try:
            await until(sub, ready("r0", "r1", "r2"))
            pids = {m.sandbox.sandbox_id: init_host_pid(d, m.sandbox.sandbox_id) for m in made}
            d.kill()  # SIGKILL: the hub and the subscription socket vanish with it
            async with asyncio.timeout(STEP):
                while (await sub.next_event()).kind != "disconnected":
                    pass
            assert sub.states == {}, "a broken stream clears every observation (CTL-3)"
            # Meanwhile execd keeps serving on the socket its supervisor bound (PID 1 owns the listener).
            socket = made[0].sandbox.execd_socket
            assert socket is not None
            assert await run(socket, "echo alive") == ("alive\n", 0)

            d.start()
            # The client reconnects by itself; every execd reconnects to the new hub with a full hello.
            await until(sub, ready("r0", "r1", "r2"))
            assert sub.connects == 2
            assert {sid: init_host_pid(d, sid) for sid in pids} == pids, "the same processes, never restarted"
            assert (await c.get(ref_of(made[2]))).state == "running"

            # Delete removes the sandbox from the stream; the others stay.
            await c.delete(ref_of(made[1]))
            await until(sub, lambda s: "r1" not in s)
            await asyncio.sleep(0.2)
            assert set(sub.states) == {"r0", "r2"}
        finally:
            await sub.close()
        sub2 = await subscription(d, c)
        try:
            snap = await sub2.next_event(STEP)
            assert snap.kind == "snapshot" and set(snap.sandboxes) == {"r0", "r2"}
        finally:
            await sub2.close()


@pytest.mark.req("IDLE-6", "IDLE-2")
async def test_close_admission_through_the_subscription_checks_the_activity_version(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(execd_request("adm"))
        socket = created.sandbox.execd_socket
        assert socket is not None
        sub = await subscription(d, c)
        try:
            await until(sub, ready("adm"))
            # An admitted, long request is in flight while admission closes.
            admitted = asyncio.create_task(run(socket, "sleep 0.8; echo done"))
            await until(sub, lambda s: s["adm"].activity.active == 1)
            await asyncio.sleep(0.2)  # let the coalesced report settle
            version = sub.states["adm"].activity.version

            stale = await sub.close_admission("adm", version - 1)
            assert stale.ok is False and stale.error == "version_changed" and stale.admission_open is True
            current = await sub.close_admission("adm", version)
            assert current.ok is True and current.admission_open is False and current.version == version

            refused = await execd_call(socket, "POST", "/v1/commands", json={"argv": ["true"]})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "admission_closed"
            assert await asyncio.wait_for(admitted, STEP) == ("done\n", 0), "the admitted request completes"
            await until(sub, lambda s: s["adm"].activity.admission_open is False and s["adm"].activity.active == 0)
            assert sub.states["adm"].activity.version == version + 1, "its end bumped the version (demand re-check)"

            reopened = await sub.open_admission("adm")
            assert reopened.ok is True and reopened.admission_open is True
            assert (await run(socket, "true"))[1] == 0
            with pytest.raises(NotFoundError, match="no sandbox"):
                await sub.close_admission("nope", 0)
        finally:
            await sub.close()


@pytest.mark.req("SEC-5")
async def test_the_subscription_socket_is_private_and_checks_the_peer_uid(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        path = (await c.health()).runtime_control_socket
    assert path is not None
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(Path(path).parent).st_mode) == 0o700
    client = (
        "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.settimeout(5)\n"
        "print(s.recv(4096).decode())"
    )
    out = await asyncio.to_thread(
        subprocess.run,
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+dac_override",
         "--ambient-caps=+dac_override", PY, "-c", client, path],
        capture_output=True, timeout=20, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    reply = json.loads(out.stdout)
    assert reply["ok"] is False and reply["error"] == "permission_denied", "another UID gets no snapshot"


@pytest.mark.req("SBX-2")
async def test_restore_of_an_execd_sandbox_rebuilds_its_init_for_the_new_id(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(execd_request("orig"))
        socket = created.sandbox.execd_socket
        assert socket is not None
        started = time.monotonic()
        while (await execd_call(socket, "GET", "/v1/health")).status_code != 200:
            assert time.monotonic() - started < STEP
        await run(socket, "echo kept > /work/file")
        ck = await c.checkpoint(ref_of(created))
        await c.delete(ref_of(created))
        from adx.sandboxd import RestoreRequest

        restored = await c.restore(
            RestoreRequest(request_id="re", location=ck.location, digest=ck.digest, sandbox_id="copy")
        )
        info = restored.sandbox
        assert info.execd is not None and info.execd_socket is not None
        assert "copy" in info.init_argv and "orig" not in info.init_argv
        sub = await subscription(d, c)
        try:
            await until(sub, ready("copy"))
        finally:
            await sub.close()
        assert await run(info.execd_socket, "cat /work/file; hostname") == ("kept\ncopy\n", 0)


@pytest.mark.req("CTL-3")
async def test_the_subscription_client_waits_for_sandboxd_and_refuses_requests_while_disconnected(
    sandboxd: DaemonFactory,
) -> None:
    d = sandboxd(start=False)
    path = d.socket.parent / "runtime-control.sock"  # the default: next to the API socket
    async with RuntimeControlSubscription(path, min_backoff=0.02, max_backoff=0.1) as sub:
        with pytest.raises(UnavailableError, match="not connected"):
            await sub.wait_connected(0.3)
        with pytest.raises(UnavailableError, match="not connected"):
            await sub.close_admission("x", 0)
        assert sub.last_error is not None and "connect failed" in sub.last_error
        d.start()
        await sub.wait_connected(STEP)
        first = await sub.next_event(STEP)
        assert first.kind == "snapshot" and first.sandboxes == {} and sub.connects == 1
        async with d.client() as c:
            await c.create(execd_request("late"))
        await until(sub, ready("late"))
        with pytest.raises(NotFoundError):
            await sub.open_admission("nope")


IMPOSTOR = r"""
import json, socket
s = socket.socket(socket.AF_UNIX)
s.connect("/run/adx-control/control.sock")
state = {"ready": True, "probe": None, "checkpointRequests": [], "workloadExitCode": 99,
         "activity": {"version": 0, "active": 0, "backgroundRunning": 0, "admissionOpen": True}}
try:
    s.sendall(json.dumps({"type": "hello", "protocol": 1, "sandboxId": "imp", "state": state}).encode() + b"\n")
    print("EOF" if s.recv(100) == b"" else "OPEN")
except OSError as exc:
    print("CLOSED", exc.errno)
"""


@pytest.mark.req("CTL-1", "SEC-5")
async def test_a_workload_process_cannot_impersonate_execd_on_the_control_socket(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(execd_request("imp", ["sleep", "1000"]))
        socket_path = created.sandbox.execd_socket
        assert socket_path is not None
        sub = await subscription(d, c)
        try:
            await until(sub, ready("imp"))
            while not sub._events.empty():
                sub._events.get_nowait()
            before = sub.states["imp"]
            out, code = await run(socket_path, f"{PY} -c '{IMPOSTOR}'")
            assert code == 0 and out.strip() in ("EOF", "CLOSED 104", "CLOSED 32"), out
            # Only the sandbox's PID 1 may report: the impostor changed nothing and kicked nothing off.
            event = await sub.next_event(STEP)  # the command's own activity (version bumps), nothing else
            assert event.sandbox_id == "imp" and event.state is not None
            assert event.state.workload_exit_code is None and event.state.ready
            await asyncio.sleep(0.3)
            assert sub.states["imp"].workload_exit_code is None
            assert sub.states["imp"].activity.version > before.activity.version, "execd still reports"
            assert "refused a control connection" in d.log()
        finally:
            await sub.close()


@pytest.mark.req("CTL-1", "RST-7")
async def test_the_node_driver_starts_execd_sandboxes_and_takes_ready_from_the_subscription(
    sandboxd: DaemonFactory,
) -> None:
    from adx.model import EnvironmentSpec, Resources
    from adx.runtime import ExecutionSpec
    from adx.runtime._sandboxd import SandboxdDriver, SubscriptionReadiness

    d = sandboxd()
    driver = SandboxdDriver(d.socket, python=PY)
    subscription = await driver.subscribe()
    try:
        readiness = SubscriptionReadiness(driver, subscription)
        resources = Resources(cpu_millis=1000, memory_bytes=128 << 20)
        spec = EnvironmentSpec(resources=resources, entrypoint=["sleep", "1000"])
        execution = await driver.start(ExecutionSpec("env-1", 1, "exec-1", spec))
        assert execution.execd_socket is not None and "sockets" in execution.execd_socket.parts
        await readiness.wait_ready(execution, STEP)
        assert await run(str(execution.execd_socket), "echo $ADX_SANDBOX_ID") == ("exec-1\n", 0)
        assert subscription.states["exec-1"].ready

        broken = EnvironmentSpec(resources=resources, entrypoint=["/nope"])
        failed = await driver.start(ExecutionSpec("env-2", 1, "exec-2", broken))
        with pytest.raises(UnavailableError, match="ended before it was ready"):
            await readiness.wait_ready(failed, STEP)
        await driver.stop(failed)
        await driver.stop(execution)
        assert await subscription.wait_until(lambda s: "exec-1" not in s, STEP)
    finally:
        await subscription.close()
        await driver.aclose()
