"""Activity counting, background commands and the admission gate, against a real execd process."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from execd_helpers import ExecdProcess, joined, run


def wait_for(execd: ExecdProcess, predicate: Any, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        activity = execd.activity()
        if predicate(activity) or time.monotonic() > deadline:
            return activity
        time.sleep(0.02)


@pytest.mark.req("IDLE-2", "IDLE-7")
def test_client_operations_count_while_in_flight_and_bump_the_version(execd: ExecdProcess) -> None:
    before = execd.activity()
    assert before["active"] == 0
    with execd.client() as client:
        client.get("/v1/health")
        assert execd.activity()["version"] == before["version"], "health checks are not client activity"
        with client.stream("POST", "/v1/commands", json={"command": "sleep 0.5"}) as resp:
            lines = resp.iter_lines()
            next(lines)
            during = execd.activity()
            assert during["active"] == 1
            assert during["version"] == before["version"] + 1, "start of a client operation bumps the version"
            for _ in lines:
                pass
    after = wait_for(execd, lambda a: a["active"] == 0)
    assert after["active"] == 0
    assert after["version"] == before["version"] + 2, "its end bumps it again"
    with execd.client() as client:
        client.get("/v1/commands")
    assert execd.activity()["version"] == before["version"] + 4


@pytest.mark.req("IDLE-3")
def test_background_command_outlives_its_client_and_its_exit_bumps_the_version(execd: ExecdProcess) -> None:
    with execd.client() as client:
        started = client.post("/v1/commands", json={"command": "sleep 1; echo done", "background": True})
        cid = started.json()["id"]
    # The client is gone: nothing is active, but the command runs and is visible in execd's state.
    after_client = execd.activity()
    assert after_client["active"] == 0, "a background command alone is not an active client request"
    assert after_client["backgroundRunning"] == 1
    version_while_running = after_client["version"]
    exited = wait_for(execd, lambda a: a["backgroundRunning"] == 0, timeout=5)
    assert exited["backgroundRunning"] == 0
    assert exited["version"] == version_while_running + 1, "the background exit bumps the version"
    with execd.client() as client:
        out = client.get(f"/v1/commands/{cid}/output").json()
    assert out["data"] == "done\n" and out["exitCode"] == 0


@pytest.mark.req("IDLE-6")
def test_close_admission_is_a_compare_and_close(execd: ExecdProcess) -> None:
    with execd.admin() as admin:
        version = admin.get("/v1/activity").json()["version"]
        stale = admin.post("/v1/admission/close", json={"expectedVersion": version - 1 if version else 99})
        assert stale.status_code == 409
        err = stale.json()["error"]
        assert err["code"] == "version_changed" and err["details"]["field"] == "expectedVersion"
        assert admin.get("/v1/activity").json()["admissionOpen"] is True, "a stale close closes nothing"
        closed = admin.post("/v1/admission/close", json={"expectedVersion": version})
        assert closed.status_code == 200 and closed.json()["admissionOpen"] is False
        assert closed.json()["version"] == version, "control operations never bump the version"
        with execd.client() as client:
            refused = client.post("/v1/commands", json={"argv": ["true"]})
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "admission_closed"
            assert "admitting" in refused.json()["error"]["message"]
            assert client.get("/v1/health").status_code == 200, "health is not gated"
        assert admin.get("/v1/activity").json()["version"] == version, "a refused request is no activity"
        reopened = admin.post("/v1/admission/open")
        assert reopened.json()["admissionOpen"] is True
        with execd.client() as client:
            assert client.post("/v1/commands", json={"argv": ["true"]}).status_code == 200
        bad = admin.post("/v1/admission/close", json={"expectedVersion": "7"})
        assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "expectedVersion"


@pytest.mark.req("IDLE-6")
def test_admitted_request_completes_after_admission_closes(execd: ExecdProcess) -> None:
    frames: list[dict[str, Any]] = []
    admitted = threading.Event()

    def long_request() -> None:
        with (
            execd.client() as client,
            client.stream("POST", "/v1/commands", json={"command": "sleep 0.6; echo finished"}) as resp,
        ):
            for line in resp.iter_lines():
                frames.append(json.loads(line))
                admitted.set()

    thread = threading.Thread(target=long_request)
    thread.start()
    try:
        assert admitted.wait(5)
        activity = execd.activity()
        assert activity["active"] == 1
        with execd.admin() as admin:
            closed = admin.post("/v1/admission/close", json={"expectedVersion": activity["version"]})
            assert closed.status_code == 200
        with execd.client() as client:
            assert client.get("/v1/commands").status_code == 503
    finally:
        thread.join(10)
    assert frames[-1]["exitCode"] == 0
    assert joined([f for f in frames if "stream" in f], "stdout") == "finished\n"
    after = execd.activity()
    assert after["active"] == 0 and after["version"] == activity["version"] + 1 and not after["admissionOpen"]


@pytest.mark.req("IDLE-2")
def test_concurrent_requests_are_all_counted(execd: ExecdProcess) -> None:
    threads = []
    gate = threading.Barrier(4)

    def request() -> None:
        with execd.client() as client:
            gate.wait(5)
            run(client, command="sleep 0.5")

    for _ in range(3):
        threads.append(threading.Thread(target=request))
        threads[-1].start()
    gate.wait(5)
    peak = wait_for(execd, lambda a: a["active"] == 3)
    for thread in threads:
        thread.join(10)
    assert peak["active"] == 3
    assert execd.activity()["active"] == 0


@pytest.mark.req("IDLE-2")
def test_a_stalled_upload_stops_counting_as_activity(execd_factory: Any, short_dir: Any) -> None:
    """An abandoned-but-open upload is active while it is plausible, then fails with 408 and ends."""
    import socket

    execd = execd_factory("--body-idle-timeout", "0.5")
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(execd.socket))
    try:
        sock.sendall(f"PUT /v1/files?path={short_dir}/f HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc".encode())
        assert wait_for(execd, lambda a: a["active"] == 1)["active"] == 1
        sock.settimeout(5)
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b'"request_timeout"' in answer
        assert wait_for(execd, lambda a: a["active"] == 0)["active"] == 0
    finally:
        sock.close()
