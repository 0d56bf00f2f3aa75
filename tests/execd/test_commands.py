"""Commands through a real execd process: streaming, exit codes, timeouts, kill, stdin/env/cwd, background."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from execd_helpers import ExecdProcess, joined, rss_kib, run


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent reaps it).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_output_arrives_incrementally(execd: ExecdProcess) -> None:
    """The first line is delivered long before the command ends (streamed, not buffered)."""
    started = time.monotonic()
    first_at = None
    frames = []
    with (
        execd.client() as client,
        client.stream("POST", "/v1/commands", json={"command": "echo first; sleep 1.2; echo last"}) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/x-ndjson"
        for line in resp.iter_lines():
            frame = json.loads(line)
            frames.append(frame)
            if frame.get("data") == "first\n":
                first_at = time.monotonic() - started
    ended_at = time.monotonic() - started
    assert first_at is not None, frames
    assert first_at < 0.6, f"first line after {first_at:.3f}s"
    assert ended_at >= 1.2
    assert frames[0]["pid"] > 0 and frames[0]["id"]
    assert frames[-1] == {"exitCode": 0, "signal": None, "timedOut": False}
    assert joined([f for f in frames if "stream" in f], "stdout") == "first\nlast\n"


def test_exit_codes_and_separate_streams(execd: ExecdProcess) -> None:
    with execd.client() as client:
        frames, end = run(client, command="echo out; echo err >&2; exit 7")
        assert end["exitCode"] == 7 and end["signal"] is None
        assert joined(frames, "stdout") == "out\n"
        assert joined(frames, "stderr") == "err\n"
        frames, end = run(client, argv=["/bin/false"])
        assert end["exitCode"] == 1
        frames, end = run(client, argv=["printf", "\\377\\000x"], encoding="base64")
        assert end["exitCode"] == 0
        import base64

        assert b"".join(base64.b64decode(f["data"]) for f in frames) == b"\xff\x00x"


def test_timeout_kills_the_whole_process_group(execd: ExecdProcess, short_dir: Path) -> None:
    marker = short_dir / "grandchild.pid"
    started = time.monotonic()
    with execd.client() as client:
        _, end = run(client, command=f"sleep 30 & echo $! > {marker}; wait", timeoutSeconds=0.5)
    assert time.monotonic() - started < 5
    assert end == {"exitCode": 128 + 9, "signal": 9, "timedOut": True}
    grandchild = int(marker.read_text())
    assert wait_until(lambda: not pid_alive(grandchild)), "timeout must kill the command's whole group"


def test_kill_a_background_command(execd: ExecdProcess) -> None:
    with execd.client() as client:
        started = client.post("/v1/commands", json={"argv": ["sleep", "30"], "background": True})
        assert started.status_code == 201
        cid, pid = started.json()["id"], started.json()["pid"]
        assert client.get(f"/v1/commands/{cid}").json()["state"] == "running"
        killed = client.post(f"/v1/commands/{cid}/kill", json={"signal": "SIGTERM"})
        assert killed.json() == {"id": cid, "signal": "SIGTERM", "delivered": True}
        assert wait_until(lambda: client.get(f"/v1/commands/{cid}").json()["state"] == "exited")
        status = client.get(f"/v1/commands/{cid}").json()
        assert status["signal"] == 15 and status["exitCode"] == 128 + 15
        assert not pid_alive(pid)
        assert client.post(f"/v1/commands/{cid}/kill", json={}).json()["delivered"] is False


def test_kill_takes_a_signal_name_or_number_never_a_boolean(execd: ExecdProcess) -> None:
    """JSON true is no signal number: it was read as 1 (SIGHUP) and delivered; it is refused like any bad value."""
    with execd.client() as client:
        started = client.post("/v1/commands", json={"argv": ["sleep", "30"], "background": True})
        cid = started.json()["id"]
        for bad in (True, 1.5, [9], "SIGNOPE"):
            refused = client.post(f"/v1/commands/{cid}/kill", json={"signal": bad})
            assert refused.status_code == 400 and refused.json()["error"]["details"]["field"] == "signal", bad
            assert client.get(f"/v1/commands/{cid}").json()["state"] == "running"
        killed = client.post(f"/v1/commands/{cid}/kill", json={"signal": 9})
        assert killed.json() == {"id": cid, "signal": "SIGKILL", "delivered": True}


def test_stdin_env_and_cwd(execd: ExecdProcess, short_dir: Path) -> None:
    with execd.client() as client:
        frames, end = run(client, argv=["cat"], stdin="hello stdin")
        assert joined(frames, "stdout") == "hello stdin" and end["exitCode"] == 0
        frames, _ = run(client, command="echo $GREETING; pwd", env={"GREETING": "hi there"}, cwd=str(short_dir))
        assert joined(frames, "stdout") == f"hi there\n{short_dir}\n"


def test_background_output_is_kept_in_a_bounded_ring(execd_factory: Callable[..., ExecdProcess]) -> None:
    execd = execd_factory("--ring-bytes", "1000")
    with execd.client() as client:
        cid = client.post(
            "/v1/commands", json={"command": "for i in $(seq 1 500); do echo line$i; done", "background": True}
        ).json()["id"]
        assert wait_until(lambda: client.get(f"/v1/commands/{cid}").json()["state"] == "exited")
        out = client.get(f"/v1/commands/{cid}/output", params={"stream": "stdout"}).json()
        assert out["exitCode"] == 0
        assert len(out["data"]) == 1000, "only the newest ring-bytes are kept"
        assert out["data"].endswith("line500\n")
        assert out["droppedBytes"] == out["offset"] > 0
        assert out["nextOffset"] == out["offset"] + 1000
        again = client.get(f"/v1/commands/{cid}/output", params={"offset": out["nextOffset"]}).json()
        assert again["data"] == ""


def test_background_stdin_stays_open_until_closed(execd: ExecdProcess) -> None:
    with execd.client() as client:
        cid = client.post("/v1/commands", json={"argv": ["cat"], "background": True, "keepStdinOpen": True}).json()[
            "id"
        ]
        assert client.post(f"/v1/commands/{cid}/stdin", content=b"part1 ").json()["written"] == 6
        assert client.get(f"/v1/commands/{cid}").json()["state"] == "running"
        client.post(f"/v1/commands/{cid}/stdin", params={"close": "true"}, content=b"part2")
        assert wait_until(lambda: client.get(f"/v1/commands/{cid}").json()["state"] == "exited")
        assert client.get(f"/v1/commands/{cid}/output").json()["data"] == "part1 part2"


def test_list_and_delete(execd: ExecdProcess) -> None:
    with execd.client() as client:
        a = client.post("/v1/commands", json={"argv": ["sleep", "30"], "background": True}).json()["id"]
        b = client.post("/v1/commands", json={"argv": ["true"], "background": True}).json()["id"]
        listed = {c["id"]: c for c in client.get("/v1/commands").json()["commands"]}
        assert {a, b} <= set(listed)
        conflict = client.delete(f"/v1/commands/{a}")
        assert conflict.status_code == 409
        assert wait_until(lambda: client.get(f"/v1/commands/{b}").json()["state"] == "exited")
        assert client.delete(f"/v1/commands/{b}").status_code == 204
        assert client.get(f"/v1/commands/{b}").status_code == 404
        client.post(f"/v1/commands/{a}/kill", json={})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "argv"),
        ({"argv": "ls"}, "argv"),
        ({"argv": ["ls"], "command": "ls"}, "argv"),
        ({"command": ""}, "command"),
        ({"argv": ["/no/such/binary"]}, "argv"),
        ({"argv": ["ls"], "cwd": "relative"}, "cwd"),
        ({"argv": ["ls"], "cwd": "/no/such/dir"}, "cwd"),
        ({"argv": ["ls"], "timeoutSeconds": -1}, "timeoutSeconds"),
        ({"argv": ["ls"], "env": {"A": 1}}, "env.A"),
        ({"argv": ["ls"], "background": "yes"}, "background"),
        ({"argv": ["ls"], "colour": "blue"}, "colour"),
        ({"argv": ["ls"], "encoding": "latin-1"}, "encoding"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(execd: ExecdProcess, body: dict[str, object], field: str) -> None:
    with execd.client() as client:
        resp = client.post("/v1/commands", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_input"
    assert error["details"]["field"] == field
    assert field in error["message"]


def test_malformed_json_and_unknown_routes(execd: ExecdProcess) -> None:
    with execd.client() as client:
        resp = client.post("/v1/commands", content=b"{not json")
        assert resp.status_code == 400 and resp.json()["error"]["details"]["field"] == "body"
        assert client.get("/v1/nope").status_code == 404
        assert client.get("/v1/commands/unknown").json()["error"]["details"]["field"] == "id"


def test_foreground_command_dies_with_its_client(execd: ExecdProcess) -> None:
    """A client that hangs up during a silent foreground command takes the command with it."""
    with execd.client() as client, client.stream("POST", "/v1/commands", json={"argv": ["sleep", "30"]}) as resp:
        pid = json.loads(next(resp.iter_lines()))["pid"]
        assert pid_alive(pid)
    # leaving both contexts closed the connection
    assert wait_until(lambda: not pid_alive(pid), 3.0)
    with execd.client() as client:
        assert client.get("/v1/commands").json()["commands"] == []


def test_keep_alive_connection_serves_many_requests(execd: ExecdProcess) -> None:
    transport = httpx.HTTPTransport(uds=str(execd.socket))
    with httpx.Client(transport=transport, base_url="http://execd") as client:
        for _ in range(20):
            _, end = run(client, argv=["true"])
            assert end["exitCode"] == 0


def test_unset_env_keeps_execd_private_variables_out_of_commands(
    execd_factory: Callable[..., ExecdProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXECD_PRIVATE", "secret")
    monkeypatch.setenv("SHARED", "visible")
    execd = execd_factory("--unset-env", "EXECD_PRIVATE")
    with execd.client() as client:
        frames, _ = run(client, command="echo ${EXECD_PRIVATE-unset} $SHARED")
    assert joined(frames, "stdout") == "unset visible\n"


def test_multibyte_characters_split_across_chunks_survive(execd: ExecdProcess) -> None:
    with execd.client() as client:
        frames, _ = run(client, command=r"printf '\342\234'; sleep 0.2; printf '\223 ok\n'")
    assert joined(frames, "stdout") == "\u2713 ok\n"


def test_fast_output_to_a_slow_client_is_bounded_by_backpressure(execd: ExecdProcess) -> None:
    """40 MiB of output read slowly: execd pauses the command's pipe instead of buffering the output."""
    idle_hwm = rss_kib(execd.pid, "VmHWM")
    total = 0
    with (
        execd.client() as client,
        client.stream(
            "POST", "/v1/commands", json={"command": "head -c 41943040 /dev/zero", "encoding": "base64"}
        ) as resp,
    ):
        for i, chunk in enumerate(resp.iter_raw()):
            total += len(chunk)
            if i < 40:
                time.sleep(0.01)  # a slow reader at first: the producer must wait, not pile up output
    assert total > 40 * 1024 * 1024 * 4 / 3
    growth_mib = (rss_kib(execd.pid, "VmHWM") - idle_hwm) / 1024
    print(f"execd VmHWM growth streaming 40 MiB to a slow client: {growth_mib:.2f} MiB")
    assert growth_mib < 12, f"execd peak RSS grew {growth_mib:.1f} MiB streaming 40 MiB to a slow client"
