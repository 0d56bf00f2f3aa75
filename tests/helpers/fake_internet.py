"""A test host standing in for the internet: a network namespace this fixture creates, joined to the host by a
veth pair, with a small HTTP server inside; a sandbox reaches it only through the node (forwarding + NAT), like
any outside address. Shared by the sandboxd, node and E2B network tests."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sbx_helpers import wait_until

__all__ = ["PROBE", "FakeInternet", "fake_internet", "sh"]

#: What a sandbox runs to probe a TCP destination: prints ok, refused (with the seconds it took) or timeout.
PROBE = """
import socket, sys, time
t = time.monotonic()
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    print("ok", s.recv(64).split(b"\\r\\n")[0].decode(), flush=True)
except ConnectionRefusedError:
    print("refused", round(time.monotonic() - t, 3), flush=True)
except OSError as exc:
    print("error", type(exc).__name__, round(time.monotonic() - t, 3), flush=True)
"""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


@dataclass
class FakeInternet:
    netns: str
    address: str
    port: int
    #: A second address of the same host (routed through ``address``): a policy can deny one and allow the other.
    other: str


@pytest.fixture
def fake_internet() -> Iterator[FakeInternet]:
    """A network namespace with a veth pair to the host and an HTTP server inside (removed even on failure)."""
    tag = secrets.token_hex(3)
    netns, host_if, third = f"adxt-{tag}", f"adxt{tag}", 100 + secrets.randbelow(100)
    outer, inner, other = f"10.251.{third}.1", f"10.251.{third}.2", f"10.251.{third}.6"
    server: subprocess.Popen[bytes] | None = None
    try:
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "addr", "add", f"{outer}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "-n", netns, "addr", "add", f"{inner}/30", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        sh("ip", "-n", netns, "route", "add", "default", "via", outer)
        sh("ip", "-n", netns, "addr", "add", f"{other}/32", "dev", "eth0")
        sh("ip", "route", "add", f"{other}/32", "via", inner)  # goes with host_if
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "http.server", "8080", "--bind", "0.0.0.0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for address in (inner, other):
            probe = ["ip", "netns", "exec", netns, sys.executable, "-c", PROBE, address, "8080"]
            wait_until(lambda probe=probe: sh(*probe).stdout.startswith("ok"), timeout=15)
        yield FakeInternet(netns, inner, 8080, other)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        sh("ip", "link", "del", host_if, check=False)
        sh("ip", "netns", "del", netns, check=False)
