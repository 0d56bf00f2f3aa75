"""Runtime control: execd -> per-sandbox control socket -> ControlHub -> one node-level subscription.

Real sockets throughout. The end-to-end tests run real execd processes; the 50-sandbox test runs 50 of
execd's real ``ControlClient`` reporters in this process (same code, same sockets, without 50 interpreters).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from execd_helpers import STEP, ExecdProcess, Subscriber

from adx.execd import _protocol as P
from adx.execd._activity import Activity
from adx.execd._control import ControlClient
from adx.sandboxd._control_hub import ControlHub


def async_client(execd: ExecdProcess, admin: bool = False) -> httpx.AsyncClient:
    path = execd.admin_socket if admin else execd.socket
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(path)), base_url="http://execd", timeout=10)


@pytest.fixture
async def hub(short_dir: Path) -> Any:
    hub = ControlHub(short_dir / "node.sock", coalesce=0.02)
    await hub.start()
    yield hub
    await hub.stop()


@pytest.mark.req("CTL-1", "CTL-3", "IDLE-6")
async def test_execd_reports_ready_activity_checkpoints_and_admission_through_the_hub(
    hub: ControlHub, execd_factory: Callable[..., ExecdProcess], short_dir: Path
) -> None:
    sub, snapshot = await Subscriber.connect(hub.subscribe_path)
    assert snapshot["sandboxes"] == {}
    control = short_dir / "sb1.ctl"
    await hub.add_sandbox("sb1", control)
    execd = execd_factory("--control-socket", str(control), "--sandbox-id", "sb1", wait=False)
    await sub.until(lambda s: s.get("sb1", {}).get("ready") is True)

    # Activity: a client command shows up as coalesced deltas ending at execd's own version.
    async with async_client(execd) as client:
        for _ in range(5):
            resp = await client.post("/v1/commands", json={"argv": ["true"]})
            assert resp.status_code == 200
        async with async_client(execd, admin=True) as admin:
            version = (await admin.get("/v1/activity")).json()["version"]
        await sub.until(lambda s: s["sb1"]["activity"]["version"] == version)
        assert len(sub.deltas) < 12, "10 version bumps must be coalesced into fewer deltas"

        # Workload checkpoint request: carried in the state, deduplicated by operation ID.
        for _ in range(2):
            resp = await client.post("/v1/checkpoint-requests", json={"operationId": "op-1", "reason": "snapshot"})
            assert resp.status_code == 202
        assert resp.json() == {"operationId": "op-1", "duplicate": True}
        await sub.until(lambda s: [c["operationId"] for c in s["sb1"]["checkpointRequests"]] == ["op-1"])
        await hub.ack_checkpoint("sb1", "op-1")
        await sub.until(lambda s: s["sb1"]["checkpointRequests"] == [])

        # IDLE-6 through the node-level stream: stale fails and closes nothing, current closes.
        current = hub.state("sb1")
        assert current is not None
        version = current["activity"]["version"]
        stale = await sub.request(
            {"type": "close_admission", "requestId": 1, "sandboxId": "sb1", "expectedVersion": version - 1}
        )
        assert stale["ok"] is False and stale["error"] == "version_changed"
        assert (await client.get("/v1/commands")).status_code == 200
        version += 2  # that list request started and ended
        await sub.until(lambda s: s["sb1"]["activity"]["version"] == version)
        closed = await sub.request(
            {"type": "close_admission", "requestId": 2, "sandboxId": "sb1", "expectedVersion": version}
        )
        assert closed["ok"] is True and closed["admissionOpen"] is False
        refused = await client.post("/v1/commands", json={"argv": ["true"]})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "admission_closed"
        await sub.until(lambda s: s["sb1"]["activity"]["admissionOpen"] is False)
        assert hub.state("sb1")["activity"]["version"] == version  # type: ignore[index]
        reopened = await sub.request({"type": "open_admission", "requestId": 3, "sandboxId": "sb1"})
        assert reopened["ok"] is True
        assert (await client.post("/v1/commands", json={"argv": ["true"]})).status_code == 200
        unknown = await sub.request({"type": "open_admission", "requestId": 4, "sandboxId": "nope"})
        assert unknown["ok"] is False and unknown["error"] == "not_found"

        # The control socket goes away: observation cleared; execd reconnects to the new socket and the
        # fresh hello carries the still-pending checkpoint request (kept during the disconnect, CTL-7).
        await client.post("/v1/checkpoint-requests", json={"operationId": "op-2"})
        await sub.until(lambda s: len(s["sb1"]["checkpointRequests"]) == 1)
        await hub.remove_sandbox("sb1")
        await sub.until(lambda s: "sb1" not in s)
        assert sub.deltas[-1]["state"] is None
        await hub.add_sandbox("sb1", control)
        await sub.until(lambda s: "sb1" in s)
        assert [c["operationId"] for c in sub.states["sb1"]["checkpointRequests"]] == ["op-2"]
        assert sub.states["sb1"]["ready"] is True

    # execd dies: its observation is cleared in the stream.
    os.kill(execd.pid, signal.SIGKILL)
    await sub.until(lambda s: "sb1" not in s)
    assert hub.state("sb1") is None
    sub.close()


@pytest.mark.req("CTL-1", "RST-6")
async def test_probe_failures_are_pushed_and_ready_waits_for_the_probe(
    hub: ControlHub, execd_factory: Callable[..., ExecdProcess], short_dir: Path
) -> None:
    sub, _ = await Subscriber.connect(hub.subscribe_path)
    control = short_dir / "p.ctl"
    await hub.add_sandbox("p", control)
    healthy = short_dir / "healthy"
    execd_factory(
        "--control-socket", str(control), "--sandbox-id", "p",
        "--probe-command", f"test -e {healthy}", "--probe-interval", "0.05", "--probe-timeout", "1",
        wait=False,
    )  # fmt: skip
    await sub.until(lambda s: (s.get("p", {}).get("probe") or {}).get("consecutiveFailures", 0) >= 2)
    state = sub.states["p"]
    assert state["ready"] is False and state["probe"]["ok"] is False
    assert "exited with 1" in state["probe"]["reason"]
    healthy.touch()
    await sub.until(lambda s: s["p"]["ready"] is True and s["p"]["probe"]["ok"] is True)
    assert sub.states["p"]["probe"]["consecutiveFailures"] == 0
    sub.close()


@pytest.mark.req("CTL-1")
async def test_tcp_probe(hub: ControlHub, execd_factory: Callable[..., ExecdProcess], short_dir: Path) -> None:
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    sub, _ = await Subscriber.connect(hub.subscribe_path)
    control = short_dir / "t.ctl"
    await hub.add_sandbox("t", control)
    execd_factory(
        "--control-socket", str(control), "--probe-tcp-port", str(port), "--probe-interval", "0.05", wait=False
    )
    await sub.until(lambda s: (s.get("t", {}).get("probe") or {}).get("ok") is False)
    assert f"tcp port {port}" in sub.states["t"]["probe"]["reason"]
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
    try:
        await sub.until(lambda s: s["t"]["ready"] is True)
    finally:
        server.close()
    sub.close()


@pytest.mark.req("CTL-1")
async def test_workload_exit_is_reported(
    hub: ControlHub, execd_factory: Callable[..., ExecdProcess], short_dir: Path
) -> None:
    sub, _ = await Subscriber.connect(hub.subscribe_path)
    control = short_dir / "w.ctl"
    await hub.add_sandbox("w", control)
    execd_factory(
        "--control-socket", str(control), "--keep-running-after-workload-exit", "--", "sh", "-c", "sleep 0.3; exit 5",
        wait=False,
    )  # fmt: skip
    await sub.until(lambda s: s.get("w", {}).get("workloadExitCode") == 5)
    sub.close()


@pytest.mark.req("CTL-2", "CTL-3")
async def test_fifty_sandboxes_one_subscription_snapshot_then_deltas(hub: ControlHub, short_dir: Path) -> None:
    count = 50
    clients: dict[str, ControlClient] = {}
    for i in range(count):
        sid = f"sb-{i:02d}"
        await hub.add_sandbox(sid, short_dir / f"{sid}.ctl")
        client = ControlClient(short_dir / f"{sid}.ctl", sandbox_id=sid, execution_id="e1", activity=Activity())
        client.emit({"type": P.READY})
        client.start()
        clients[sid] = client
    try:
        async with asyncio.timeout(STEP):
            while len(hub.snapshot()) < count:  # noqa: ASYNC110 - polling the hub's state is the test's view
                await asyncio.sleep(0.01)

        sub, snapshot = await Subscriber.connect(hub.subscribe_path)
        assert sorted(snapshot["sandboxes"]) == sorted(clients), "one snapshot with all 50"
        assert all(state["ready"] for state in snapshot["sandboxes"].values())

        # A burst of 20 changes on one sandbox: only that sandbox's deltas, coalesced, newest state last.
        activity = clients["sb-07"].activity
        for _ in range(10):
            activity.begin()
            activity.end()
        await sub.until(lambda s: s["sb-07"]["activity"]["version"] == 20)
        with pytest.raises(TimeoutError):
            await sub.next(seconds=0.3)  # nothing else is pending
        assert {d["sandboxId"] for d in sub.deltas} == {"sb-07"}
        assert len(sub.deltas) <= 3, f"20 changes should coalesce, got {len(sub.deltas)} deltas"
        assert [d["seq"] for d in sub.deltas] == list(range(1, len(sub.deltas) + 1))

        # A dropped execd connection clears exactly that sandbox's observation.
        await clients["sb-09"].stop()
        await sub.until(lambda s: "sb-09" not in s)
        assert sub.deltas[-1] == {"type": "delta", "seq": sub.deltas[-1]["seq"], "sandboxId": "sb-09", "state": None}

        # Reconnecting the subscriber starts over with a full snapshot of the current state.
        sub.close()
        sub2, snapshot2 = await Subscriber.connect(hub.subscribe_path)
        assert len(snapshot2["sandboxes"]) == count - 1 and "sb-09" not in snapshot2["sandboxes"]
        assert snapshot2["sandboxes"]["sb-07"]["activity"]["version"] == 20
        assert snapshot2["seq"] == 0

        # The execd side reconnects by itself, and its hello restores the observation.
        clients["sb-09"].start()
        await sub2.until(lambda s: "sb-09" in s)
        assert clients["sb-09"].connects == 2
        sub2.close()
    finally:
        for client in clients.values():
            await client.stop()


@pytest.mark.req("CTL-3")
async def test_execd_reconnects_when_the_hub_restarts(short_dir: Path) -> None:
    """The whole hub (sandboxd) goes away and comes back: the reporter reconnects with a full hello."""
    path = short_dir / "r.ctl"
    activity = Activity()
    client = ControlClient(path, sandbox_id="r", execution_id=None, activity=activity)
    client.start()
    try:
        for round_ in range(2):
            hub = ControlHub(short_dir / "node.sock")
            await hub.start()
            await hub.add_sandbox("r", path)
            activity.begin()
            started = time.monotonic()
            async with asyncio.timeout(STEP):
                while (state := hub.state("r")) is None or state["activity"]["version"] != activity.version:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert time.monotonic() - started < 2.0
            activity.end()
            await hub.stop()
            assert round_ + 1 == client.connects
    finally:
        await client.stop()


@pytest.mark.req("CTL-3")
async def test_hub_requests_fail_cleanly_and_garbage_drops_the_connection(hub: ControlHub, short_dir: Path) -> None:
    from adx.errors import NotFoundError, UnavailableError

    path = short_dir / "g.ctl"
    await hub.add_sandbox("g", path)
    with pytest.raises(NotFoundError):
        await hub.close_admission("nope", 0)
    with pytest.raises(UnavailableError):
        await hub.close_admission("g", 0)  # registered, but no execd connected: no fresh information
    sub, _ = await Subscriber.connect(hub.subscribe_path)
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(P.encode({"type": "hello", "protocol": 1, "sandboxId": "g", "state": P.initial_state()}))
    await writer.drain()
    await sub.until(lambda s: "g" in s)
    writer.write(b"this is not json\n")
    await writer.drain()
    await sub.until(lambda s: "g" not in s)
    assert await asyncio.wait_for(reader.read(), STEP) == b"", "the hub closed the bad connection"
    writer.close()
    with pytest.raises(ValueError):
        await hub.add_sandbox("g", path)
    sub.close()


async def test_an_execd_that_never_answers_a_request_times_out(short_dir: Path) -> None:
    from adx.errors import UnavailableError

    hub = ControlHub(short_dir / "n.sock", request_timeout=0.3)
    await hub.start()
    try:
        await hub.add_sandbox("mute", short_dir / "m.ctl")
        _, writer = await asyncio.open_unix_connection(str(short_dir / "m.ctl"))
        writer.write(P.encode({"type": "hello", "protocol": 1, "sandboxId": "mute", "state": P.initial_state()}))
        await writer.drain()
        async with asyncio.timeout(STEP):
            while not hub.connected("mute"):  # noqa: ASYNC110 - polling the hub's state is the test's view
                await asyncio.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            await hub.close_admission("mute", 0)
        assert time.monotonic() - started < 2
        writer.close()
    finally:
        await hub.stop()


@pytest.mark.req("SEC-5")
async def test_the_hub_binds_only_in_a_real_directory_and_never_follows_a_planted_symlink(
    hub: ControlHub, short_dir: Path
) -> None:
    """A socket dir that is a symlink is refused; a symlink planted at the socket path is replaced (unlinked,
    never followed) and the socket gets its mode without any chmod by path."""
    real = short_dir / "real"
    real.mkdir()
    (short_dir / "link").symlink_to(real)
    with pytest.raises(OSError, match="not a directory"):
        await hub.add_sandbox("l", short_dir / "link" / "c.sock")
    victim = short_dir / "victim"
    victim.write_text("host file")
    os.chmod(victim, 0o644)
    planted = real / "c.sock"
    planted.symlink_to(victim)
    await hub.add_sandbox("l", planted)
    st = os.lstat(planted)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert victim.read_text() == "host file" and stat.S_IMODE(os.stat(victim).st_mode) == 0o644


@pytest.mark.req("CTL-3")
async def test_sockets_beyond_sun_path_length_work(short_dir: Path) -> None:
    deep = short_dir / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    hub = ControlHub(deep / "node.sock")
    await hub.start()
    try:
        await hub.add_sandbox("x", deep / "x.ctl")
        client = ControlClient(
            f"/proc/self/fd/{os.open(deep, os.O_PATH)}/x.ctl", sandbox_id="x", execution_id=None, activity=Activity()
        )
        client.start()
        async with asyncio.timeout(STEP):
            while not hub.connected("x"):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await client.stop()
    finally:
        await hub.stop()


@pytest.mark.req("CTL-3")
async def test_a_connection_lost_and_replaced_within_one_coalescing_window_still_shows_the_break(
    short_dir: Path,
) -> None:
    hub = ControlHub(short_dir / "w.sock", coalesce=0.5)
    await hub.start()
    try:
        await hub.add_sandbox("w", short_dir / "w.ctl")
        sub, _ = await Subscriber.connect(hub.subscribe_path)
        hello = P.encode({"type": "hello", "protocol": 1, "sandboxId": "w", "state": P.initial_state()})
        _, first = await asyncio.open_unix_connection(str(short_dir / "w.ctl"))
        first.write(hello)
        await first.drain()
        await sub.until(lambda s: "w" in s)  # leading edge: sent at once
        _, second = await asyncio.open_unix_connection(str(short_dir / "w.ctl"))  # the newest wins
        second.write(hello)
        await second.drain()
        assert (await sub.next())["state"] is None, "the replaced connection's break is visible"
        assert (await sub.next())["state"] is not None
        first.close()
        second.close()
        sub.close()
    finally:
        await hub.stop()


@pytest.mark.req("CTL-3", "NOD-3")
async def test_ready_goes_out_at_once_even_inside_a_coalescing_window(short_dir: Path) -> None:
    """Ready (what a node's start waits for) is never held back by the coalescing window: a claimed warm member's
    execd connects and reports Ready a few ms apart, and the Ready delta used to wait out the window begun by the
    connect's delta (20 ms by default, on every create). Activity changes are still coalesced."""
    hub = ControlHub(short_dir / "r.sock", coalesce=0.5)
    await hub.start()
    try:
        await hub.add_sandbox("r", short_dir / "r.ctl")
        sub, _ = await Subscriber.connect(hub.subscribe_path)
        _, execd = await asyncio.open_unix_connection(str(short_dir / "r.ctl"))
        execd.write(P.encode({"type": "hello", "protocol": 1, "sandboxId": "r", "state": P.initial_state()}))
        await execd.drain()
        first = await sub.next()  # leading edge: sent at once
        assert first["state"] is not None and not first["state"]["ready"]
        t0 = time.monotonic()
        execd.write(P.encode({"type": "ready"}))
        await execd.drain()
        second = await sub.next()
        assert second["state"]["ready"], second
        assert time.monotonic() - t0 < 0.25, "Ready waited for the coalescing window"
        # A window already waiting on a coalesced change is ended by the urgent one.
        execd.write(P.encode({"type": "hello", "protocol": 1, "sandboxId": "r", "state": P.initial_state()}))
        await execd.drain()
        await asyncio.sleep(0.05)  # the reconnect's not-ready state is pending, its window running
        t1 = time.monotonic()
        execd.write(P.encode({"type": "ready"}))
        await execd.drain()
        third = await sub.next()
        assert third["state"]["ready"], third
        assert time.monotonic() - t1 < 0.25, "Ready waited for a window that was already running"
        execd.close()
        sub.close()
    finally:
        await hub.stop()


@pytest.mark.req("CTL-8")
async def test_an_execd_of_another_protocol_is_refused_with_its_reason_and_a_matching_one_is_served(
    hub: ControlHub, short_dir: Path
) -> None:
    """An execd speaking another runtime-control protocol (as after an upgrade of sandboxd alone) is not served
    half-understood: the hub closes its connection and publishes why, naming both versions; an execd of the
    matching version connecting next is served and the refusal is gone."""
    from adx.sandboxd._control_client import RuntimeControlSubscription

    path = short_dir / "v.ctl"
    await hub.add_sandbox("v", path)
    sub, snapshot = await Subscriber.connect(hub.subscribe_path)
    assert snapshot["protocol"] == P.PROTOCOL_VERSION
    reader, writer = await asyncio.open_unix_connection(str(path))
    newer = P.PROTOCOL_VERSION + 1
    writer.write(P.encode({"type": "hello", "protocol": newer, "sandboxId": "v", "state": P.initial_state()}))
    await writer.drain()
    await sub.until(lambda s: s.get("v", {}).get("refused") is not None)
    refused = sub.states["v"]["refused"]
    assert f"protocol {newer}" in refused and f"sandboxd speaks {P.PROTOCOL_VERSION}" in refused
    assert sub.states["v"]["ready"] is False
    assert await asyncio.wait_for(reader.read(), STEP) == b"", "the hub closed the refused connection"
    writer.close()
    # The typed subscription the node uses sees the same reason.
    async with RuntimeControlSubscription(hub.subscribe_path) as typed:
        await typed.wait_connected(STEP)
        assert typed.states["v"].refused == refused
    # An execd of the matching version replaces the refusal with its own state.
    reader, writer = await asyncio.open_unix_connection(str(path))
    state = P.initial_state()
    state["ready"] = True
    writer.write(P.encode({"type": "hello", "protocol": P.PROTOCOL_VERSION, "sandboxId": "v", "state": state}))
    await writer.drain()
    await sub.until(lambda s: s.get("v", {}).get("ready") is True)
    assert sub.states["v"]["refused"] is None
    writer.close()
    sub.close()


@pytest.mark.req("CTL-8")
async def test_a_subscription_refuses_a_sandboxd_of_another_protocol_at_once(short_dir: Path) -> None:
    """The node's subscription against a runtime-control stream whose snapshot carries another protocol (a
    sandboxd of another version; here a socket speaking that version's first line) fails at once with an error
    naming both versions and the fix, instead of timing out or reading states it may misunderstand."""
    from adx.errors import VersionMismatchError
    from adx.sandboxd._control_client import RuntimeControlSubscription

    path = short_dir / "other.sock"
    served = 0

    async def other_version(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        served += 1
        snapshot = {"type": "snapshot", "seq": 0, "protocol": P.PROTOCOL_VERSION + 1, "sandboxes": {}}
        writer.write(P.encode(snapshot))
        await writer.drain()
        with contextlib.suppress(OSError):
            await reader.read()
        writer.close()

    server = await asyncio.start_unix_server(other_version, path=str(path))
    try:
        async with RuntimeControlSubscription(path) as sub:
            started = time.monotonic()
            with pytest.raises(VersionMismatchError) as refused:
                await sub.wait_connected(30)
            assert time.monotonic() - started < 5
            message = str(refused.value)
            assert f"protocol {P.PROTOCOL_VERSION + 1}" in message and f"speaks {P.PROTOCOL_VERSION}" in message
            assert "upgrade" in message
            assert not sub.connected and sub.states == {}
    finally:
        server.close()
        await server.wait_closed()
    assert served >= 1
