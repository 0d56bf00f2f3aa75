"""Egress network policy of veth sandboxes (nftables), against a test host standing in for the internet.

The test host is a network namespace this module creates, joined to the host by a veth pair, with a small
HTTP server inside; the sandbox reaches it only through the node (forwarding + NAT), like any outside address.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from fake_internet import PROBE, FakeInternet, sh
from sbx_helpers import Daemon, DaemonFactory, wait_until

from adx.errors import ConflictError, InvalidInputError
from adx.model import NetworkMode, NetworkPolicy
from adx.sandboxd import CreateRequest, SetNetworkRequest, ref_of
from adx.sandboxd._netpolicy import table_name

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v nft"], capture_output=True).returncode != 0,
    reason="needs nft (Debian's nftables package; scripts/bootstrap.sh installs it)",
)


def _table_exists(state_dir: Path) -> bool:
    return sh("nft", "list", "table", "inet", table_name(state_dir), check=False).returncode == 0


def _probe_argv(host: FakeInternet) -> list[str]:
    return ["python3", "-c", PROBE, host.address, str(host.port)]


def _ip_forward() -> str:
    return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()


def _shell_pid(procs: set[int]) -> int:
    """The host PID of the sandbox's looping shell (its init)."""
    (pid,) = [p for p in procs if Path(f"/proc/{p}/comm").read_text().strip() == "sh"]
    return pid


def _egress(**kw: object) -> NetworkPolicy:
    return NetworkPolicy.model_validate({"mode": "egress", **kw})


async def _one_shot(d: Daemon, policy: NetworkPolicy, host: FakeInternet, rid: str) -> str:
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id=rid, argv=_probe_argv(host), network_policy=policy))
        done = await c.wait(ref_of(created), timeout_seconds=30)
        assert done.sandbox.exit is not None
        out = (d.sandbox_dir(created.sandbox.sandbox_id) / "output.log").read_text().strip()
        await c.delete(ref_of(created))
        return out


@pytest.mark.req("SEC-3")
async def test_egress_reaches_the_test_host_and_deny_or_a_narrow_allow_refuses_fast(
    sandboxd: DaemonFactory, fake_internet: FakeInternet
) -> None:
    d = sandboxd()
    table = table_name(d.state_dir)
    assert _table_exists(d.state_dir), "sandboxd sets up its own nftables table at start"
    assert _ip_forward() == "1"
    assert "net.ipv4.ip_forward=1" in d.log()  # sandboxd says it routes sandbox egress

    assert (await _one_shot(d, _egress(), fake_internet, "open")).startswith("ok HTTP/1.0 200")
    denied = await _one_shot(d, _egress(deny=[f"{fake_internet.address}/32"]), fake_internet, "deny")
    assert denied.startswith("refused"), denied
    assert float(denied.split()[1]) < 1.0  # a reset, not a dropped SYN waiting for its timeout
    # An allow list that leaves the test host out denies it; one that names it lets it through.
    narrow = await _one_shot(d, _egress(allow=["192.0.2.0/24"]), fake_internet, "narrow")
    assert narrow.startswith("refused"), narrow
    wide = await _one_shot(d, _egress(allow=[fake_internet.address]), fake_internet, "wide")
    assert wide.startswith("ok"), wide
    # Deny wins over allow.
    both = await _one_shot(d, _egress(allow=["10.0.0.0/8"], deny=[fake_internet.address]), fake_internet, "both")
    assert both.startswith("refused"), both
    # DNS names are resolved when the policy is applied (localhost: no network needed to resolve it).
    named = await _one_shot(d, _egress(allow=["localhost"]), fake_internet, "named")
    assert named.startswith("refused"), named

    d.stop()
    assert not _table_exists(d.state_dir), f"table {table} must go with the daemon"


async def test_policy_changes_on_a_running_sandbox_without_a_restart(
    sandboxd: DaemonFactory, fake_internet: FakeInternet
) -> None:
    d = sandboxd()
    loop = [
        "sh",
        "-c",
        f"while :; do python3 -c '{PROBE}' {fake_internet.address} {fake_internet.port}; sleep 0.2; done",
    ]
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="live", argv=loop, network_policy=_egress()))
        ref = ref_of(created)
        log = d.sandbox_dir(created.sandbox.sandbox_id) / "output.log"

        def last_line() -> str:
            lines = log.read_text().strip().splitlines()
            return lines[-1] if lines else ""

        wait_until(lambda: last_line().startswith("ok"), timeout=20)
        init_before = _shell_pid(d.cgroup_procs(created.sandbox.sandbox_id))
        t0 = time.monotonic()
        info = await c.set_network(SetNetworkRequest(**ref.model_dump(), policy=_egress(deny=[fake_internet.address])))
        applied_ms = (time.monotonic() - t0) * 1000
        assert info.network_policy is not None and info.network_policy.deny == [f"{fake_internet.address}/32"]
        wait_until(lambda: last_line().startswith("refused"), timeout=10)
        # Same sandbox, same init: the change was made in place.
        assert (await c.get(ref)).native == created.sandbox.native
        assert _shell_pid(d.cgroup_procs(created.sandbox.sandbox_id)) == init_before
        # ... and back, then off (mode none on a veth sandbox refuses everything).
        await c.set_network(SetNetworkRequest(**ref.model_dump(), policy=_egress()))
        wait_until(lambda: last_line().startswith("ok"), timeout=10)
        await c.set_network(SetNetworkRequest(**ref.model_dump(), policy=NetworkPolicy(mode=NetworkMode.NONE)))
        wait_until(lambda: last_line().startswith("refused"), timeout=10)
        assert applied_ms < 2000
        # The policy is persisted: a restarted daemon re-installs it in a fresh table.
        await c.set_network(SetNetworkRequest(**ref.model_dump(), policy=_egress(allow=[fake_internet.address])))
    d.stop()
    d.start()
    async with d.client() as c:
        assert (await c.get(ref)).network_policy == _egress(allow=[f"{fake_internet.address}/32"])
        wait_until(lambda: last_line().startswith("ok"), timeout=10)
        with pytest.raises(InvalidInputError, match=r"network\.allow\[0\]"):
            await c.set_network(SetNetworkRequest(**ref.model_dump(), policy=_egress(allow=["no-such-host.invalid"])))
        await c.delete(ref)
    # The sandbox's chain goes with it.
    chains = sh("nft", "list", "table", "inet", table_name(d.state_dir)).stdout
    assert "sb_adxv" not in chains


@pytest.mark.req("SEC-3", "SBX-10")
async def test_a_sigkilled_sandboxd_restarts_with_every_veth_policy_in_force(
    sandboxd: DaemonFactory, fake_internet: FakeInternet
) -> None:
    """After a SIGKILL the new daemon rebuilds its table: the surviving sandbox's deny must be in it again,
    not an open veth (the table was once rebuilt before the records were loaded, with no sandbox in it)."""
    d = sandboxd()
    host, port = fake_internet, fake_internet.port
    # Each round probes the denied address, then the allowed one, one line each: "d <result>", "a <result>".
    loop = [
        "sh",
        "-c",
        f"while :; do printf 'd '; python3 -c '{PROBE}' {host.address} {port};"
        f" printf 'a '; python3 -c '{PROBE}' {host.other} {port}; sleep 0.1; done",
    ]
    async with d.client() as c:
        policy = _egress(deny=[host.address])
        created = await c.create(CreateRequest(request_id="survivor", argv=loop, network_policy=policy))
    ref, log = ref_of(created), d.sandbox_dir(created.sandbox.sandbox_id) / "output.log"

    def rounds(after: int) -> list[str]:
        return log.read_text()[after:].splitlines()[:-1]  # the last line may be half written

    wait_until(lambda: {"d refused", "a ok"} <= {" ".join(line.split()[:2]) for line in rounds(0)}, timeout=20)
    d.kill()
    d.start()
    after = len(log.read_text())  # the new daemon's table is in place: every probe from here on sees it
    wait_until(lambda: sum(line.startswith("d ") for line in rounds(after)) >= 3, timeout=20)
    lines = rounds(after)
    assert all(line.startswith("d refused") for line in lines if line.startswith("d ")), lines
    assert any(line.startswith("a ok") for line in lines), lines
    async with d.client() as c:
        assert (await c.get(ref)).network_policy == _egress(deny=[f"{host.address}/32"])
        await c.delete(ref)


async def test_mode_none_has_only_lo_and_cannot_be_switched_to_egress(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(
            CreateRequest(
                request_id="lo",
                argv=["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1; exec sleep 1000"],
                network_policy=NetworkPolicy(mode=NetworkMode.NONE),
            )
        )
        assert created.sandbox.network == "none" and created.sandbox.address is None
        log = d.sandbox_dir(created.sandbox.sandbox_id) / "output.log"
        wait_until(lambda: log.read_text().strip() != "")
        assert log.read_text().split() == ["lo"]
        with pytest.raises(ConflictError, match=r"network\.mode"):
            await c.set_network(SetNetworkRequest(**ref_of(created).model_dump(), policy=_egress()))
        await c.delete(ref_of(created))


def test_policy_validation_names_the_field() -> None:
    from adx.model import EnvironmentSpec, parse_wire

    base = {"resources": {"cpuMillis": 100, "memoryBytes": 1 << 26}}
    with pytest.raises(InvalidInputError, match=r"network\.allow\[2\]: not a CIDR or DNS name"):
        parse_wire(EnvironmentSpec, {**base, "network": {"mode": "egress", "allow": ["10.0.0.0/8", "a.b", "x y"]}})
    with pytest.raises(InvalidInputError, match=r"network\.deny\[0\]: not a CIDR or DNS name"):
        parse_wire(EnvironmentSpec, {**base, "network": {"mode": "egress", "deny": ["10.0.0.300"]}})
    with pytest.raises(InvalidInputError, match=r"network\.mode"):
        parse_wire(EnvironmentSpec, {**base, "network": {"mode": "bridge"}})
    spec = parse_wire(EnvironmentSpec, {**base, "network": {"mode": "egress", "deny": ["Example.COM.", "10.1.2.3"]}})
    assert spec.network is not None and spec.network.deny == ["example.com", "10.1.2.3/32"]
