"""Egress network policy of veth sandboxes, enforced with nftables (Debian's ``nft``).

One ``inet`` table per sandboxd instance, named after its state dir (``adx_<hash>``) so two daemons on one host
never touch each other's rules. The table holds:
- ``forward``: packets from a sandbox's veth jump, through the verdict map ``ifs`` keyed by the host-side veth
  name, into that sandbox's own chain ``sb_<veth>``; replacing one sandbox's policy is one nftables transaction
  (flush + refill its chain; in process through libnftables: ``_nft``), so no packet ever sees half a policy;
- ``input``: a sandbox reaches the node itself only for DNS (tcp/udp 53); nothing else of the host;
- ``post``: masquerade (NAT through the node) of the sandbox pool's traffic leaving for other networks.

Refusals are ``reject`` (a TCP reset, ICMP unreachable otherwise), never ``drop``: a denied connect fails at
once instead of hanging until its timeout. Sandbox-to-sandbox traffic is refused; nothing is published inbound
(the Relay reaches a sandbox's ports from inside its network namespace, not through the veth).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from adx.errors import AdxError, InvalidInputError
from adx.model import NetworkMode, NetworkPolicy
from adx.model._network import is_cidr
from adx.sandboxd._nft import Nft

__all__ = ["NetFilter", "ResolvedPolicy", "table_name"]

log = logging.getLogger("adx.sandboxd")

#: Every sandboxd's host-side veth names start with this (see _veth.host_if).
VETH_PREFIX = "adxv"
_IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def table_name(state_dir: Path) -> str:
    return "adx_" + hashlib.sha256(str(state_dir.absolute()).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class ResolvedPolicy:
    """A policy with its DNS names turned into addresses (at apply time: names are not re-resolved later)."""

    mode: NetworkMode
    allow: tuple[str, ...] | None  # None: every destination not denied
    deny: tuple[str, ...]


def _resolve_one(field: str, target: str) -> list[str]:
    if is_cidr(target):
        return [target]
    try:
        infos = socket.getaddrinfo(target, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise InvalidInputError(field, f"{target!r} does not resolve: {exc}") from None
    return sorted({str(ipaddress.ip_network(info[4][0])) for info in infos})


def resolve(policy: NetworkPolicy) -> ResolvedPolicy:
    """Blocking (getaddrinfo): call from a worker thread."""
    allow = None
    if policy.allow is not None:
        allow = tuple(a for i, t in enumerate(policy.allow) for a in _resolve_one(f"network.allow[{i}]", t))
    deny = tuple(a for i, t in enumerate(policy.deny) for a in _resolve_one(f"network.deny[{i}]", t))
    return ResolvedPolicy(policy.mode, allow, deny)


def _refuse(match: str) -> list[str]:
    """Rules refusing what ``match`` selects: TCP gets a reset, everything else ICMP unreachable."""
    return [f"{match} meta l4proto tcp reject with tcp reset", f"{match} reject"]


def _by_family(targets: tuple[str, ...]) -> list[str]:
    """``ip daddr {...}`` / ``ip6 daddr {...}`` matches for the targets (empty: none)."""
    v4 = [t for t in targets if ipaddress.ip_network(t).version == 4]
    v6 = [t for t in targets if ipaddress.ip_network(t).version == 6]
    out = []
    if v4:
        out.append(f"ip daddr {{ {', '.join(v4)} }}")
    if v6:
        out.append(f"ip6 daddr {{ {', '.join(v6)} }}")
    return out


class NetFilter:
    def __init__(self, state_dir: Path, pool: str) -> None:
        self.table = table_name(state_dir)
        self.pool = pool
        self.nft = Nft()
        self.ready = False

    def _run(self, script: str) -> None:
        self.nft.run(script)

    def setup(self, policies: Mapping[str, NetworkPolicy] | None = None) -> None:
        """(Re)create this instance's table from scratch and enable IPv4 forwarding (egress needs it).

        ``policies`` (host-side veth name -> policy) are those of the sandboxes that outlived the previous
        daemon: they go into the new table in the same transaction, so no packet ever crosses a veth while its
        sandbox's chain is missing (a missing chain means open egress). A policy whose names no longer resolve
        fails closed: its veth refuses everything until a new policy is set.
        """
        if not self.nft.available:
            log.warning("nft is not installed: veth sandboxes get no egress policy and no NAT")
            return
        if _IP_FORWARD.read_text().strip() != "1":
            _IP_FORWARD.write_text("1\n")
            log.info("enabled IPv4 forwarding (net.ipv4.ip_forward=1) for sandbox egress")
        else:
            log.info("IPv4 forwarding already enabled (net.ipv4.ip_forward=1): sandbox egress is routed")
        t = self.table
        chains = "".join(
            self.script(host_if, self._resolved_or_closed(host_if, p)) for host_if, p in (policies or {}).items()
        )
        self._run(
            f"table inet {t}\n"
            f"delete table inet {t}\n"
            f"table inet {t} {{\n"
            "  map ifs { type ifname : verdict; }\n"
            "  set sandboxes { type ifname; }\n"
            "  chain forward { type filter hook forward priority filter; policy accept; iifname vmap @ifs; }\n"
            "  chain input { type filter hook input priority filter; policy accept;\n"
            "    ct state established,related accept\n"
            "    iifname @sandboxes meta l4proto { tcp, udp } th dport 53 accept\n"
            "    iifname @sandboxes meta l4proto tcp reject with tcp reset\n"
            "    iifname @sandboxes reject\n"
            "  }\n"
            "  chain post { type nat hook postrouting priority srcnat; policy accept;\n"
            f"    ip saddr {self.pool} ip daddr != {self.pool} masquerade\n"
            "  }\n"
            "}\n" + chains
        )
        self.ready = True
        log.info("nftables table inet %s ready (masquerade for %s)", t, self.pool)

    @staticmethod
    def _resolved_or_closed(host_if: str, policy: NetworkPolicy) -> ResolvedPolicy:
        try:
            return resolve(policy)
        except AdxError as exc:
            log.error("network policy of %s not re-applied (%s): egress refused", host_if, exc)
            return ResolvedPolicy(NetworkMode.NONE, None, ())

    def teardown(self) -> None:
        if not self.nft.available or not self.ready:
            return
        self._run(f"table inet {self.table}\ndelete table inet {self.table}\n")
        self.ready = False
        log.info("nftables table inet %s removed", self.table)

    def script(self, host_if: str, policy: ResolvedPolicy) -> str:
        """One transaction: the sandbox's chain emptied and refilled, and its veth mapped to it."""
        t, chain = self.table, f"sb_{host_if}"
        rules: list[str] = []
        if policy.mode is NetworkMode.NONE:
            rules += _refuse("")  # egress switched off at runtime: the veth stays, every packet is refused
        else:
            rules += _refuse(f'oifname "{VETH_PREFIX}*"')  # sandbox to sandbox
            for match in _by_family(policy.deny):  # deny wins over allow and over DNS
                rules += _refuse(match)
            rules.append("meta l4proto { tcp, udp } th dport 53 accept")  # the resolver
            if policy.allow is None:
                rules.append("accept")
            else:
                rules += [f"{match} accept" for match in _by_family(policy.allow)]
                rules += _refuse("")
        lines = [
            f"add chain inet {t} {chain}",
            f"flush chain inet {t} {chain}",
            *(f"add rule inet {t} {chain} {rule.strip()}" for rule in rules),
            f'add element inet {t} ifs {{ "{host_if}" : jump {chain} }}',
            f'add element inet {t} sandboxes {{ "{host_if}" }}',
        ]
        return "\n".join(lines) + "\n"

    def apply(self, host_if: str, policy: NetworkPolicy) -> ResolvedPolicy:
        """Resolve and install one sandbox's policy atomically (blocking: from a worker thread)."""
        resolved = resolve(policy)
        self._run(self.script(host_if, resolved))
        return resolved

    def remove(self, host_if: str) -> None:
        """Forget one sandbox's rules (idempotent: the adds make the deletes valid when nothing was there)."""
        if not self.nft.available or not self.ready:
            return
        t, chain = self.table, f"sb_{host_if}"
        self._run(
            f"add chain inet {t} {chain}\n"
            f'add element inet {t} ifs {{ "{host_if}" : jump {chain} }}\n'
            f'add element inet {t} sandboxes {{ "{host_if}" }}\n'
            f'delete element inet {t} ifs {{ "{host_if}" }}\n'
            f'delete element inet {t} sandboxes {{ "{host_if}" }}\n'
            f"flush chain inet {t} {chain}\n"
            f"delete chain inet {t} {chain}\n"
        )
