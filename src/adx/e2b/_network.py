"""E2B's network options (``allow_internet_access``, ``network={allowOut, denyOut, ...}``) as ADX's network
policy (``EnvironmentSpec.network``, docs/network.md).

| E2B | ADX |
|---|---|
| nothing said (E2B: internet on) | ``{"mode": "egress"}`` |
| ``allow_internet_access=False``, or ``denyOut`` with ``0.0.0.0/0``, no ``allowOut`` | ``{"mode": "none"}`` |
| ``denyOut`` with ``0.0.0.0/0`` and ``allowOut`` | ``{"mode": "egress", "allow": allowOut}`` |
| ``denyOut`` without ``0.0.0.0/0`` | ``{"mode": "egress", "deny": denyOut}`` |

E2B's ``allowOut`` wins over ``denyOut``; ADX's ``deny`` wins over ``allow``. They agree except for an
``allowOut`` entry inside a partial ``denyOut`` (an exception carved out of a denied range), which ADX cannot
say: it is refused (400) rather than enforced differently. Options ADX does not enforce (``maskRequestHost``,
``dnsServers``, ``egressProxy``, ``rules``, ``httpsPorts``, ``allowPublicTraffic=False``) are refused too.
"""

from __future__ import annotations

import ipaddress

from adx.errors import InvalidInputError
from adx.model import NetworkMode, NetworkPolicy, parse_wire

ALL_TRAFFIC = frozenset({"0.0.0.0/0", "::/0"})
_KNOWN = frozenset(
    {"allowOut", "denyOut", "allowPublicTraffic", "maskRequestHost", "dnsServers", "egressProxy", "rules",
     "httpsPorts", "allow_internet_access"}
)  # fmt: skip
_UNENFORCED = ("maskRequestHost", "dnsServers", "egressProxy", "rules", "httpsPorts")


def _targets(value: object, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInputError(field, "must be a list of CIDRs, IP addresses or domain names")
    for i, entry in enumerate(value):
        if not isinstance(entry, str):
            raise InvalidInputError(f"{field}[{i}]", "must be a string")
        try:
            parse_wire(NetworkPolicy, {"mode": "egress", "deny": [entry]})
        except InvalidInputError:
            raise InvalidInputError(
                f"{field}[{i}]", f"{entry[:100]!r} is not a CIDR, IP address or domain name"
            ) from None
    return list(value)


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None  # a domain name


def _overlaps(allow: str, deny: list[str]) -> bool:
    """Whether ``allow`` may lie inside a ``deny`` entry (a name may resolve anywhere: it may)."""
    net = _network(allow)
    if net is None:
        return bool(deny)
    for entry in deny:
        other = _network(entry)
        if other is None or (net.version == other.version and net.overlaps(other)):
            return True
    return False


def network_policy(allow_internet_access: object, network: object, field: str = "network") -> NetworkPolicy:
    """The ADX policy for E2B's options (see the module's table); bad or unsupported options raise
    InvalidInputError naming the E2B field."""
    if allow_internet_access is not None and not isinstance(allow_internet_access, bool):
        raise InvalidInputError("allow_internet_access", "must be a boolean")
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise InvalidInputError(field, "must be a JSON object")
    unknown = sorted(set(network) - _KNOWN)
    if unknown:
        raise InvalidInputError(f"{field}.{unknown[0]}", "unknown field")
    for name in _UNENFORCED:
        if network.get(name):
            raise InvalidInputError(f"{field}.{name}", "is not supported by this server")
    if network.get("allowPublicTraffic") is False:
        raise InvalidInputError(
            f"{field}.allowPublicTraffic", "false is not supported: sandbox ports are reached by their host name"
        )
    inner = network.get("allow_internet_access")  # the update body carries it inside network
    if allow_internet_access is None and inner is not None:
        return network_policy(inner, {k: v for k, v in network.items() if k != "allow_internet_access"}, field)
    allow = _targets(network.get("allowOut"), f"{field}.allowOut")
    deny = _targets(network.get("denyOut"), f"{field}.denyOut")
    if allow_internet_access is False:
        deny = [*deny, "0.0.0.0/0"]
    if any(entry in ALL_TRAFFIC for entry in deny):
        wire: dict[str, object] = {"mode": "egress", "allow": allow} if allow else {"mode": "none"}
    else:
        for i, entry in enumerate(allow):
            if _overlaps(entry, deny):
                raise InvalidInputError(
                    f"{field}.allowOut[{i}]",
                    f"{entry!r} as an exception inside denyOut is not supported (ADX's deny wins over allow); "
                    "deny 0.0.0.0/0 and list what is allowed instead",
                )
        wire = {"mode": "egress", "deny": deny}
    return parse_wire(NetworkPolicy, wire)


def e2b_network_options(policy: NetworkPolicy | None) -> tuple[bool | None, dict[str, list[str]] | None]:
    """The other way: what a sandbox's policy says in E2B's terms (``allowInternetAccess``, ``network``), as its
    sandbox detail reports them. The default (egress, no lists) was not said at create: both null."""
    if policy is None:
        return None, None
    if policy.mode is NetworkMode.NONE:
        return False, None
    if policy.allow is not None:
        return None, {"allowOut": _said(policy.allow), "denyOut": ["0.0.0.0/0"]}
    if policy.deny:
        return None, {"denyOut": _said(policy.deny)}
    return None, None


def _said(targets: list[str]) -> list[str]:
    """ADX keeps a single address as its CIDR (``10.0.0.1/32``); E2B's options name it bare."""
    return [t.removesuffix("/32") if "." in t else t.removesuffix("/128") for t in targets]
