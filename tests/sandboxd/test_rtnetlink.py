"""The veth pair over rtnetlink in process (issue 13: no ``ip -batch`` fork+exec after a veth create's commit):
``ip`` itself must see what ``ip -batch`` made before: the host end with its /30 address, up, and the peer
``eth0`` in the target process's network namespace; a taken name or a gone process are the kernel's refusals."""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from adx.sandboxd._rtnetlink import create_veth

pytestmark = pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 to look")


@pytest.fixture
def netns_proc() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a network namespace of its own (the sandbox's init, as far as the veth is concerned)."""
    proc = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/ns/net") == os.readlink("/proc/self/ns/net"):  # not unshared yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _ip_json(*argv: str) -> list[dict[str, object]]:
    out = subprocess.run(["ip", "-j", *argv], capture_output=True, text=True, check=True).stdout
    return json.loads(out) if out.strip() else []


def test_the_pair_is_what_ip_batch_made(netns_proc: subprocess.Popen[bytes]) -> None:
    host_if = f"adxt{secrets.token_hex(5)}"
    try:
        create_veth(host_if, "eth0", netns_proc.pid, "10.254.9.1", 30)
        (link,) = _ip_json("addr", "show", "dev", host_if)
        assert link["link_type"] == "ether" and "UP" in link["flags"]  # type: ignore[operator]
        addrs = [(a["family"], a["local"], a["prefixlen"]) for a in link["addr_info"]]  # type: ignore[union-attr]
        assert ("inet", "10.254.9.1", 30) in addrs
        assert _ip_json("-d", "link", "show", "dev", host_if)[0]["linkinfo"]["info_kind"] == "veth"  # type: ignore[index]
        inside = subprocess.run(
            ["nsenter", "-t", str(netns_proc.pid), "-n", "ip", "-j", "link", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (peer,) = json.loads(inside)
        assert peer["ifname"] == "eth0" and peer["link_type"] == "ether"
        # The prefix route the address brings, as with `ip addr add`.
        assert any(r.get("dst") == "10.254.9.0/30" for r in _ip_json("route", "show", "dev", host_if))
        with pytest.raises(OSError) as taken:
            create_veth(host_if, "eth0", netns_proc.pid, "10.254.9.5", 30)
        assert taken.value.errno == errno.EEXIST
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)


def test_a_gone_process_or_a_bad_name_is_refused_and_leaves_nothing() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    host_if = f"adxt{secrets.token_hex(5)}"
    with pytest.raises(OSError) as exc:
        create_veth(host_if, "eth0", gone.pid, "10.254.9.9", 30)
    assert exc.value.errno == errno.ESRCH
    assert subprocess.run(["ip", "link", "show", "dev", host_if], capture_output=True).returncode != 0
    with pytest.raises(ValueError, match="not an interface name"):
        create_veth("x" * 16, "eth0", gone.pid, "10.254.9.9", 30)
