"""Files through a real execd: streamed read, atomic streamed write, list, stat, remove, mkdir."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from execd_helpers import ExecdProcess, rss_kib


def test_write_read_stat_list_remove(execd: ExecdProcess, short_dir: Path) -> None:
    target = short_dir / "sub" / "a.txt"
    with execd.client() as client:
        missing_parent = client.put("/v1/files", params={"path": str(target)}, content=b"x")
        assert missing_parent.status_code == 404
        made = client.put("/v1/files", params={"path": str(target), "mkdirs": "true", "mode": "640"}, content=b"data")
        assert made.status_code == 201 and made.json() == {"path": str(target), "size": 4}
        assert target.read_bytes() == b"data"
        assert target.stat().st_mode & 0o777 == 0o640
        read = client.get("/v1/files", params={"path": str(target)})
        assert read.content == b"data" and read.headers["content-length"] == "4"
        stat = client.get("/v1/files/stat", params={"path": str(target)}).json()
        assert stat["type"] == "file" and stat["size"] == 4 and stat["mode"] == 0o640
        assert client.post("/v1/files/mkdir", params={"path": str(short_dir / "sub" / "d")}).status_code == 201
        listing = client.get("/v1/files/list", params={"path": str(short_dir / "sub")}).json()
        assert [(e["name"], e["type"]) for e in listing["entries"]] == [("a.txt", "file"), ("d", "directory")]
        not_empty = client.delete("/v1/files", params={"path": str(short_dir / "sub")})
        assert not_empty.status_code == 409
        assert client.delete("/v1/files", params={"path": str(target)}).status_code == 204
        assert client.get("/v1/files", params={"path": str(target)}).status_code == 404
        gone = client.delete("/v1/files", params={"path": str(short_dir / "sub"), "recursive": "true"})
        assert gone.status_code == 204 and not (short_dir / "sub").exists()


@pytest.mark.parametrize(
    ("params", "field"),
    [({}, "path"), ({"path": "relative/x"}, "path"), ({"path": "/tmp", "mode": "999"}, "mode")],
)
def test_bad_file_input_names_the_field(execd: ExecdProcess, params: dict[str, str], field: str) -> None:
    with execd.client() as client:
        resp = client.put("/v1/files", params=params, content=b"x")
    assert resp.status_code in (400, 409), resp.text
    assert resp.json()["error"]["details"]["field"] == field


def test_reading_a_directory_is_invalid(execd: ExecdProcess, short_dir: Path) -> None:
    with execd.client() as client:
        resp = client.get("/v1/files", params={"path": str(short_dir)})
    assert resp.status_code == 400 and resp.json()["error"]["details"]["field"] == "path"


def test_100_mib_round_trip_with_bounded_memory(execd: ExecdProcess, short_dir: Path) -> None:
    """Write and read 100 MiB streamed; execd's peak RSS grows by far less than the file size."""
    size, block = 100 * 1024 * 1024, 1024 * 1024
    pattern = os.urandom(block)
    target = short_dir / "big.bin"
    idle_hwm = rss_kib(execd.pid, "VmHWM")

    def body() -> Iterator[bytes]:
        for i in range(size // block):
            yield pattern[i % 7 :] + pattern[: i % 7]  # vary blocks so reordering would be caught

    expected = hashlib.sha256()
    for chunk in body():
        expected.update(chunk)
    with execd.client(timeout=120) as client:
        written = client.put("/v1/files", params={"path": str(target)}, content=body())
        assert written.status_code == 201 and written.json()["size"] == size
        got = hashlib.sha256()
        received = 0
        with client.stream("GET", "/v1/files", params={"path": str(target)}) as resp:
            assert int(resp.headers["content-length"]) == size
            for chunk in resp.iter_raw():
                got.update(chunk)
                received += len(chunk)
    assert received == size and got.hexdigest() == expected.hexdigest()
    peak_growth_mib = (rss_kib(execd.pid, "VmHWM") - idle_hwm) / 1024
    print(f"execd VmHWM growth moving 100 MiB each way: {peak_growth_mib:.2f} MiB")
    assert peak_growth_mib < 16, f"execd peak RSS grew by {peak_growth_mib:.1f} MiB moving 100 MiB"


def test_interrupted_upload_leaves_the_old_file_and_no_temp(execd: ExecdProcess, short_dir: Path) -> None:
    """Atomic write: a client that dies mid-body changes nothing."""
    target = short_dir / "keep.txt"
    target.write_bytes(b"old content")
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(execd.socket))
    sock.sendall(
        f"PUT /v1/files?path={target} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n".encode() + b"n" * 5000
    )
    time.sleep(0.2)
    assert any(p.name.startswith(".keep.txt.execd-tmp") for p in short_dir.iterdir()), "upload should be in flight"
    sock.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(p.name.startswith(".") for p in short_dir.iterdir()):
        time.sleep(0.02)
    assert target.read_bytes() == b"old content"
    assert [p.name for p in short_dir.iterdir() if p.name.startswith(".")] == []


def test_concurrent_readers_never_see_a_partial_write(execd: ExecdProcess, short_dir: Path) -> None:
    target = short_dir / "swap.bin"
    a, b = b"a" * 3_000_000, b"b" * 3_000_000
    target.write_bytes(a)
    seen: set[bytes] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            data = target.read_bytes()
            seen.add(data[:1] + data[-1:] + str(len(data)).encode())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        with execd.client() as client:
            for i in range(6):
                client.put("/v1/files", params={"path": str(target)}, content=b if i % 2 == 0 else a)
    finally:
        stop.set()
        thread.join()
    assert seen <= {b"aa3000000", b"bb3000000"}, seen


def test_expect_100_continue_upload_is_not_delayed(execd: ExecdProcess, short_dir: Path) -> None:
    """curl sends large uploads with 'Expect: 100-continue' and waits up to 1 s unless the server answers."""
    payload = os.urandom(3 * 1024 * 1024)
    src = short_dir / "src.bin"
    src.write_bytes(payload)
    target = short_dir / "dst.bin"
    started = time.monotonic()
    result = subprocess.run(
        ["curl", "-sS", "--unix-socket", str(execd.socket), "-H", "Expect: 100-continue",
         "--expect100-timeout", "5", "-T", str(src), f"http://execd/v1/files?path={target}"],
        capture_output=True, timeout=20, check=True,
    )  # fmt: skip
    assert time.monotonic() - started < 2.0, "the server must answer 100 Continue instead of making curl wait"
    assert b'"size":3145728' in result.stdout
    assert target.read_bytes() == payload


def test_stat_and_list_of_a_symlink_name_its_target_without_following(execd: ExecdProcess, short_dir: Path) -> None:
    (short_dir / "real.txt").write_bytes(b"12345")
    (short_dir / "link").symlink_to(short_dir / "real.txt")
    (short_dir / "rel").symlink_to("real.txt")
    (short_dir / "dangling").symlink_to("/nonexistent-target")
    with execd.client() as client:
        link = client.get("/v1/files/stat", params={"path": str(short_dir / "link")}).json()
        assert (link["type"], link["target"], link["targetType"]) == ("symlink", str(short_dir / "real.txt"), "file")
        assert link["size"] != 5  # the link's own size: not followed
        relative = client.get("/v1/files/stat", params={"path": str(short_dir / "rel")}).json()
        assert relative["target"] == str(short_dir / "real.txt")  # resolved to an absolute path
        dangling = client.get("/v1/files/stat", params={"path": str(short_dir / "dangling")}).json()
        assert dangling["target"] == "/nonexistent-target" and "targetType" not in dangling
        real = client.get("/v1/files/stat", params={"path": str(short_dir / "real.txt")}).json()
        assert "target" not in real
        listed = {e["name"]: e for e in client.get("/v1/files/list", params={"path": str(short_dir)}).json()["entries"]}
        assert listed["link"]["target"] == str(short_dir / "real.txt") and "target" not in listed["real.txt"]


def test_a_file_reporting_size_zero_is_read_to_its_end(execd: ExecdProcess, short_dir: Path) -> None:
    """/proc files stat as 0 bytes yet have content: read to EOF (chunked); an empty file stays empty."""
    assert os.stat("/proc/self/status").st_size == 0
    (short_dir / "empty").write_bytes(b"")
    with execd.client() as client:
        status = client.get("/v1/files", params={"path": "/proc/self/status"})
        assert status.status_code == 200 and b"Pid:" in status.content and b"Name:" in status.content
        empty = client.get("/v1/files", params={"path": str(short_dir / "empty")})
        assert empty.status_code == 200 and empty.content == b""


def test_a_read_says_the_files_modification_time(execd: ExecdProcess, short_dir: Path) -> None:
    """``Last-Modified`` (whole seconds, IMF-fixdate), what E2B's conditional downloads are answered by."""
    target = short_dir / "dated.txt"
    target.write_bytes(b"x")
    os.utime(target, (784111777.5, 784111777.5))
    with execd.client() as client:
        read = client.get("/v1/files", params={"path": str(target)})
    assert read.status_code == 200 and read.headers["last-modified"] == "Sun, 06 Nov 1994 08:49:37 GMT"


def test_a_write_that_need_not_be_durable_is_still_whole(execd: ExecdProcess, short_dir: Path) -> None:
    """``durable=false`` (the E2B API's /run/e2b files) skips the fsyncs only: the file appears whole, with its
    mode; another value is refused naming the field."""
    target = short_dir / "run" / "f"
    with execd.client() as client:
        params = {"path": str(target), "mode": "444", "mkdirs": "true", "durable": "false"}
        written = client.put("/v1/files", params=params, content=b"abc")
        assert written.status_code == 201, written.text
        refused = client.put("/v1/files", params={**params, "durable": "maybe"}, content=b"abc")
    assert target.read_bytes() == b"abc" and (target.stat().st_mode & 0o777) == 0o444
    assert refused.status_code == 400 and refused.json()["error"]["details"]["field"] == "durable"
