"""Addresses of veth sandboxes: a /30 of ``veth_pool`` each (host end .1, sandbox end .2), and the host-side
interface name, derived from the sandbox ID (so a restarted daemon finds the same veth and nftables chain)."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable

from adx.errors import ConflictError
from adx.sandboxd._netpolicy import VETH_PREFIX
from adx.sandboxd._spawn_spec import Veth

__all__ = ["VethPool", "host_if", "host_if_of"]


def host_if(sandbox_id: str) -> str:
    """The host end's interface name (at most 15 bytes, as the kernel requires)."""
    return VETH_PREFIX + hashlib.sha256(sandbox_id.encode()).hexdigest()[:10]


def host_if_of(sandbox_id: str, native_name: str | None) -> str:
    """A sandbox's host end: named after its ID, or after the warm pool member it was (``native_name``)."""
    return host_if(native_name or sandbox_id)


class VethPool:
    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._next = 0

    def resume_after(self, used: Iterable[int]) -> None:
        """At startup: allocation goes on after the highest index in use."""
        self._next = 1 + max(used, default=-1)

    def allocate(self, used: set[int]) -> int:
        """Next free /30 of the pool, round robin: a just-freed subnet is reused last, after its veth is gone."""
        pool = ipaddress.ip_network(self.pool)
        size = pool.num_addresses // 4
        for step in range(size):
            index = (self._next + step) % size
            if index not in used:
                self._next = index + 1
                return index
        raise ConflictError(f"veth pool {pool} is exhausted", details={"pool": str(pool)})

    def veth(self, sandbox_id: str, net_index: int | None, native_name: str | None = None) -> Veth | None:
        if net_index is None:
            return None
        base = ipaddress.ip_network(self.pool).network_address + 4 * net_index
        return Veth(host_if_of(sandbox_id, native_name), str(base + 1), str(base + 2))
