"""URLs the ``e2b`` SDK builds for use outside the SDK (issue 14): signed file URLs (``download_url``,
``upload_url``, the envd access token of every sandbox, ``secure=True``) and ``get_host(port)``.

They carry no ``E2b-Sandbox-Id`` header: the sandbox is in the host name (``PORT-ID.DOMAIN``, the SDK's form
once ``E2B_SANDBOX_URL`` is not set) or, at ``E2B_SANDBOX_URL``, only in the signature. Driven with plain
``httpx`` (and curl, which resolves ``*.localhost`` itself) against ``adx up``.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import Up  # annotations only: which 'conftest' module is importable depends on collection
from e2b import AsyncSandbox, Sandbox

pytestmark = pytest.mark.slow


@pytest.fixture
def sandbox(adx_up: Up) -> Iterator[Sandbox]:
    made = Sandbox.create(secure=True, **adx_up.opts())
    yield made
    made.kill()


def _with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(changes)
    return urlunsplit(parts._replace(query=urlencode(query)))


def _via_host(url: str, adx_up: Up) -> tuple[str, dict[str, str]]:
    """A ``http(s)://NAME.localhost:PORT/...`` URL sent to the API's address with its host name as ``Host``
    (what a TLS proxy in front of ADX, or a resolver that maps ``*.localhost``, delivers)."""
    parts = urlsplit(url)
    api = urlsplit(adx_up.url)
    return urlunsplit(parts._replace(scheme="http", netloc=api.netloc)), {"Host": parts.netloc}


# 1. Signed file URLs at E2B_SANDBOX_URL --------------------------------------------------------------------


def test_signed_urls_at_the_sandbox_url_download_and_upload(adx_up: Up, sandbox: Sandbox) -> None:
    """``download_url``/``upload_url`` with ``E2B_SANDBOX_URL`` set: ``{sandbox_url}/files?path&signature``;
    a plain GET/POST works (ADX answered its own 404 before), tampered or expired URLs get envd's 401."""
    sandbox.files.write("/root/signed.txt", "signed content")
    url = sandbox.download_url("/root/signed.txt")
    assert "signature=v1_" in url
    got = httpx.get(url)
    assert got.status_code == 200, got.text
    assert got.content == b"signed content"

    up = sandbox.upload_url("/root/uploaded.txt", use_signature_expiration=120)
    assert "signature_expiration=" in up
    posted = httpx.post(up, files={"file": ("whatever-name.txt", b"uploaded bytes")})
    assert posted.status_code == 200, posted.text
    # The signed path is where the file goes, whatever the part's file name says.
    assert sandbox.files.read("/root/uploaded.txt") == "uploaded bytes"
    assert not sandbox.files.exists("whatever-name.txt")

    # A read signature does not write; another path, a forged signature or an expiry moved are refused.
    for bad in (
        httpx.post(url, files={"file": ("x", b"nope")}),
        httpx.get(_with_query(url, path="/etc/passwd")),
        httpx.get(_with_query(url, signature="v1_" + "A" * 43)),
        httpx.get(_with_query(up, signature_expiration=str(int(time.time()) + 9999))),
    ):
        assert bad.status_code == 401, bad.text
        assert set(bad.json()) == {"code", "message"} and bad.json()["code"] == 401
    assert sandbox.files.read("/root/signed.txt") == "signed content"

    expired = sandbox.download_url("/root/signed.txt", use_signature_expiration=1)
    time.sleep(2.1)
    refused = httpx.get(expired)
    assert refused.status_code == 401
    assert "expired" in refused.json()["message"]

    missing = httpx.get(_with_query(url, signature=""))
    assert missing.status_code == 401


async def test_signed_urls_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(secure=True, **adx_up.opts())
    try:
        await sandbox.files.write("a.txt", "async signed")  # relative: the home directory
        async with httpx.AsyncClient() as client:
            got = await client.get(sandbox.download_url("a.txt", use_signature_expiration=60))
            assert got.status_code == 200, got.text
            assert got.text == "async signed"
            posted = await client.post(sandbox.upload_url("b.txt"), content=b"raw body")
            assert posted.status_code == 200, posted.text
        assert await sandbox.files.read("b.txt") == "raw body"
    finally:
        await sandbox.kill()


def test_a_signed_url_of_another_tenants_sandbox_is_not_served_for_this_one(adx_up: Up) -> None:
    """A signature binds the sandbox: the same path signed for one sandbox does not read another's file."""
    one = Sandbox.create(**adx_up.opts())
    other = Sandbox.create(**adx_up.opts(adx_up.other_key))
    try:
        one.files.write("/root/x.txt", "one")
        other.files.write("/root/x.txt", "other")
        assert httpx.get(one.download_url("/root/x.txt")).text == "one"
        assert httpx.get(other.download_url("/root/x.txt")).text == "other"
    finally:
        one.kill()
        other.kill()


def _get_until_served(target: str, headers: dict[str, str]) -> httpx.Response:
    """GET until the server started in the background answers (or 20 s pass)."""
    deadline = time.monotonic() + 20
    while True:
        got = httpx.get(target, headers=headers, timeout=120)
        if got.status_code == 200 or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


# 2. The host-name form (no E2B_SANDBOX_URL) and get_host ----------------------------------------------------


def _hosted(adx_up: Up, sandbox: Sandbox) -> Sandbox:
    """The same sandbox as the SDK sees it without ``E2B_SANDBOX_URL``: every URL names ``PORT-ID.DOMAIN``."""
    return Sandbox.connect(sandbox.sandbox_id, api_url=adx_up.url, api_key=adx_up.key)


def test_signed_urls_in_the_host_name_form(adx_up: Up, sandbox: Sandbox) -> None:
    hosted = _hosted(adx_up, sandbox)
    sandbox.files.write("/root/h.txt", "by host")
    url = hosted.download_url("/root/h.txt")
    assert urlsplit(url).hostname.startswith(f"49983-{sandbox.sandbox_id}.")  # type: ignore[union-attr]
    target, headers = _via_host(url, adx_up)
    got = httpx.get(target, headers=headers)
    assert got.status_code == 200, got.text
    assert got.text == "by host"
    tampered = httpx.get(_with_query(target, path="/root/other.txt"), headers=headers)
    assert tampered.status_code == 401


def test_get_host_reaches_a_server_in_the_sandbox_also_after_pause(adx_up: Up, sandbox: Sandbox) -> None:
    host = sandbox.get_host(8000)
    assert host.startswith(f"8000-{sandbox.sandbox_id}.") and ".localhost:" in host, host
    sandbox.files.write("/home/user/www/index.html", "served from the sandbox")
    sandbox.commands.run("cd /home/user/www && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
    url = f"http://{host}/index.html"
    target, headers = _via_host(url, adx_up)
    got = _get_until_served(target, headers)
    assert got.status_code == 200, got.text
    assert got.text == "served from the sandbox"
    if shutil.which("curl"):  # curl resolves *.localhost to the loopback itself: the URL as a user types it
        out = subprocess.run(["curl", "-sS", "-f", url], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout == "served from the sandbox", out.stderr

    # A forged domain (another tenant's name, or no proof) reaches nothing.
    forged = headers["Host"].replace(f"{sandbox.sandbox_id}.", f"{sandbox.sandbox_id}.aaaa", 1)
    assert httpx.get(target, headers={"Host": forged}).status_code == 404

    sandbox.pause()
    # Traffic to the paused sandbox's port wakes it (the server is started again as the sandbox restarts its
    # entrypoint only, so start it again after the wake-up the request caused).
    woke = httpx.get(target, headers=headers, timeout=120)
    assert woke.status_code in (200, 502), woke.text
    assert sandbox.is_running()
    sandbox.commands.run("cd /home/user/www && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
    got = _get_until_served(target, headers)
    assert got.text == "served from the sandbox"


async def test_get_host_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(**adx_up.opts())
    try:
        await sandbox.files.write("/home/user/www/a.txt", "async port")
        await sandbox.commands.run("cd /home/user/www && python3 -m http.server 8001 --bind 127.0.0.1", background=True)
        target, headers = _via_host(f"http://{sandbox.get_host(8001)}/a.txt", adx_up)
        async with httpx.AsyncClient() as client:
            for _ in range(100):
                got = await client.get(target, headers=headers)
                if got.status_code == 200:
                    break
                await asyncio.sleep(0.2)
        assert got.status_code == 200 and got.text == "async port", got.text
    finally:
        await sandbox.kill()


def test_range_requests_on_downloads_answer_206_and_416_as_envd(adx_up: Up, sandbox: Sandbox) -> None:
    """``GET /files`` with ``Range`` (a signed download URL, and the SDK's own headers) as envd's Go
    ``ServeContent``: 206 with ``Content-Range`` for one range (``a-b``, ``a-``, ``-n``; an end past the file is cut
    at its end), 416 with ``Content-Range: bytes */size`` when it starts past the end or cannot be parsed; without
    ``Range`` (or with several ranges) the whole file, 200, saying ``Accept-Ranges: bytes``."""
    sandbox.files.write("ranged.txt", "0123456789")
    url = sandbox.download_url("ranged.txt")
    for wanted, body, content_range in (
        ("bytes=2-5", b"2345", "bytes 2-5/10"),
        ("bytes=7-", b"789", "bytes 7-9/10"),
        ("bytes=-3", b"789", "bytes 7-9/10"),
        ("bytes=5-100", b"56789", "bytes 5-9/10"),
        ("bytes=0-0", b"0", "bytes 0-0/10"),
    ):
        got = httpx.get(url, headers={"Range": wanted})
        assert (got.status_code, got.content, got.headers["content-range"]) == (206, body, content_range), wanted
        assert got.headers["content-length"] == str(len(body)) and got.headers["content-type"].startswith("text/plain")
    for wanted in ("bytes=10-", "bytes=abc", "bytes=5-2", "bytes=-0"):
        got = httpx.get(url, headers={"Range": wanted})
        assert (got.status_code, got.headers["content-range"]) == (416, "bytes */10"), wanted
        assert got.json()["code"] == 416
    whole = httpx.get(url)
    assert (whole.status_code, whole.content, whole.headers["accept-ranges"]) == (200, b"0123456789", "bytes")
    several = httpx.get(url, headers={"Range": "bytes=0-1,4-5,20-"})  # one past the end: dropped
    assert several.status_code == 206
    kind, _, boundary = several.headers["content-type"].partition("; boundary=")
    assert kind == "multipart/byteranges" and boundary, several.headers
    assert (
        several.content
        == (
            f"--{boundary}\r\nContent-Range: bytes 0-1/10\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n01"
            f"\r\n--{boundary}\r\nContent-Range: bytes 4-5/10\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n45"
            f"\r\n--{boundary}--\r\n"
        ).encode()
    )
    assert several.headers["content-length"] == str(len(several.content))
    backwards = httpx.get(url, headers={"Range": "bytes=8-9,0-1"})  # out of order: the file is read again
    assert backwards.status_code == 206 and b"\r\n\r\n89\r\n" in backwards.content
    assert backwards.content.index(b"bytes 8-9/10") < backwards.content.index(b"bytes 0-1/10")
    assert httpx.get(url, headers={"Range": "bytes=0-1,20-"}).headers["content-range"] == "bytes 0-1/10"
    overlapping = httpx.get(url, headers={"Range": "bytes=0-7,2-9"})  # more than the file: sent whole
    assert (overlapping.status_code, overlapping.content) == (200, b"0123456789")
    # The SDK's own envd call (access token and sandbox headers) takes a Range too.
    headers = {"X-Access-Token": sandbox._envd_access_token or "", "E2b-Sandbox-Id": sandbox.sandbox_id}
    got = httpx.get(f"{adx_up.url}/files", params={"path": "ranged.txt"}, headers={**headers, "Range": "bytes=-2"})
    assert (got.status_code, got.content) == (206, b"89"), got.text
    # Several ranges of a file larger than one chunk of the stream: cut across chunk boundaries.
    data = bytes(range(256)) * 1200
    sandbox.files.write("parts.bin", data)
    got = httpx.get(sandbox.download_url("parts.bin"), headers={"Range": "bytes=10-70000,200000-,-5"})
    assert got.status_code == 206
    assert data[10:70001] in got.content and data[200000:] in got.content and got.content.count(data[-5:]) >= 2
    # A range inside a file larger than one chunk of the stream: cut across chunk boundaries.
    data = bytes(range(256)) * 1200
    sandbox.files.write("big.bin", data)
    got = httpx.get(sandbox.download_url("big.bin"), headers={"Range": "bytes=70000-250000"})
    assert (got.status_code, got.content) == (206, data[70000:250001])
    assert got.headers["content-range"] == f"bytes 70000-250000/{len(data)}"


def test_conditional_downloads_answer_as_envd(adx_up: Up, sandbox: Sandbox) -> None:
    """envd serves downloads with Go's ``ServeContent`` and the file's modification time (no ETag): every answer
    says ``Last-Modified``; ``If-Modified-Since`` at or after it is 304, ``If-Unmodified-Since`` before it 412,
    ``If-None-Match: *`` 304 (an ETag list matches nothing), ``If-Match`` other than ``*`` 412, and ``If-Range``
    honours a ``Range`` only when it is the file's date (else the whole file)."""
    sandbox.files.write("cond.txt", "0123456789")
    sandbox.commands.run("touch -d '2024-01-02 03:04:05 UTC' /home/user/cond.txt")
    url = sandbox.download_url("cond.txt")
    stamp, before, after = (
        "Tue, 02 Jan 2024 03:04:05 GMT",
        "Mon, 01 Jan 2024 00:00:00 GMT",
        "Wed, 03 Jan 2024 00:00:00 GMT",
    )
    whole = httpx.get(url)
    assert (whole.status_code, whole.headers["last-modified"], whole.content) == (200, stamp, b"0123456789")
    for headers, status in (
        ({"If-Modified-Since": stamp}, 304),
        ({"If-Modified-Since": after}, 304),
        ({"If-Modified-Since": before}, 200),
        ({"If-Modified-Since": "not a date"}, 200),
        ({"If-Unmodified-Since": before}, 412),
        ({"If-Unmodified-Since": stamp}, 200),
        ({"If-None-Match": "*"}, 304),
        ({"If-None-Match": '"abc"', "If-Modified-Since": stamp}, 200),  # If-None-Match decides, not the date
        ({"If-Match": "*"}, 200),
        ({"If-Match": '"abc"'}, 412),
        ({"If-Match": '"abc"', "If-Unmodified-Since": after}, 412),
    ):
        got = httpx.get(url, headers=headers)
        assert got.status_code == status, (headers, got.status_code)
        if status != 200:
            assert got.content == b"" and got.headers["last-modified"] == stamp, headers
    for if_range, status, body in ((stamp, 206, b"23"), (before, 200, b"0123456789"), ('"x"', 200, b"0123456789")):
        got = httpx.get(url, headers={"Range": "bytes=2-3", "If-Range": if_range})
        assert (got.status_code, got.content) == (status, body), if_range
    # The SDK's own envd call is answered alike.
    headers = {"X-Access-Token": sandbox._envd_access_token or "", "E2b-Sandbox-Id": sandbox.sandbox_id}
    got = httpx.get(f"{adx_up.url}/files", params={"path": "cond.txt"}, headers={**headers, "If-Modified-Since": stamp})
    assert got.status_code == 304, got.text
