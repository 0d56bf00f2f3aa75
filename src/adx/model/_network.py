"""An Environment's network policy (the mutable ``network`` part of its spec, NOD-10)."""

from __future__ import annotations

import enum
import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, Field

from adx.model._base import ApiModel

__all__ = ["MAX_NETWORK_TARGETS", "NetworkMode", "NetworkPolicy", "is_cidr"]

MAX_NETWORK_TARGETS = 256
# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens; at least one letter somewhere
# so that a malformed address ("10.0.0.300") is not read as a name.
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_DNS_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")


class NetworkMode(enum.StrEnum):
    NONE = "none"  # a network namespace with only lo
    EGRESS = "egress"  # plus a veth pair, NAT through the node, filtered by allow/deny


def is_cidr(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def _target(value: str) -> str:
    if is_cidr(value):
        return str(ipaddress.ip_network(value, strict=False))
    if _DNS_NAME.match(value) and not value.replace(".", "").isdigit():
        return value.rstrip(".").lower()
    raise ValueError("not a CIDR or DNS name")


# The published schema's form of what _target accepts (a subset: a client following it is never refused):
# an IPv4 address or CIDR, or a DNS name whose last label starts with a letter. IPv6 is accepted beyond it.
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_SCHEMA_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_SCHEMA_LAST_LABEL = r"[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
TARGET_SCHEMA_PATTERN = (
    rf"^(({_OCTET}\.){{3}}{_OCTET}(/(3[0-2]|[12]?[0-9]))?|({_SCHEMA_LABEL}\.){{0,126}}{_SCHEMA_LAST_LABEL}\.?)$"
)

Target = Annotated[
    str,
    AfterValidator(_target),
    Field(max_length=253, json_schema_extra={"pattern": TARGET_SCHEMA_PATTERN}),
]


class NetworkPolicy(ApiModel):
    """``allow``: when given, only these destinations are reachable (plus DNS); ``deny`` wins over ``allow``.
    DNS names are resolved by sandboxd when the policy is applied (create, change, resume), not per packet."""

    mode: NetworkMode = Field(
        default=NetworkMode.NONE,
        description="none: only lo; egress: reach destinations through the node (NAT), filtered by allow and deny",
    )
    allow: list[Target] | None = Field(
        default=None,
        max_length=MAX_NETWORK_TARGETS,
        description="when given, only these CIDRs and DNS names are reachable (plus DNS)",
    )
    deny: list[Target] = Field(
        default_factory=list,
        max_length=MAX_NETWORK_TARGETS,
        description="CIDRs and DNS names never reachable; wins over allow",
    )
