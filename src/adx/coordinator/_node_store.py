"""The nodes in the Coordinator's store: registration under a process session (NOD-6), heartbeats, capacity
samples (RES-4) and reservations; ``adx.coordinator._placement`` reads them to place Environments."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from adx.coordinator import _scripts
from adx.coordinator._keys import NODE_SET, node_key, node_reservations_key
from adx.coordinator._redis_store import RedisStore, ScriptArg, _text
from adx.errors import InvalidInputError, NotFoundError, SessionRejectedError
from adx.model import MAX_CPU_OVERCOMMIT, NodeRecord, Resources


class NodeRegistry(RedisStore):
    """The nodes part of :class:`adx.coordinator._store.CoordinatorStore`."""

    def __init__(self, client: aioredis.Redis, *, wait_replicas: int = 0, wait_timeout: float = 1.0) -> None:
        super().__init__(client, wait_replicas=wait_replicas, wait_timeout=wait_timeout)
        self._register_node = client.register_script(_scripts.REGISTER_NODE)
        self._heartbeat = client.register_script(_scripts.HEARTBEAT)
        self._report_capacity = client.register_script(_scripts.REPORT_CAPACITY)

    async def register_node(
        self,
        name: str,
        *,
        session: str,
        address: str,
        relay_address: str = "",
        session_ttl: float = 15.0,
        checkpoint_capable: bool = False,
        shared_storage: bool = False,
    ) -> str:
        """Register (or re-register) a node under a new process session; returns the previous session."""
        args: list[ScriptArg] = [
            session,
            session_ttl,
            time.time(),
            address,
            relay_address,
            int(checkpoint_capable),
            int(shared_storage),
            name,
        ]
        _, previous = await self._script("register node", self._register_node, [node_key(name), NODE_SET], args)
        return _text(previous)

    async def heartbeat(self, name: str, session: str, session_ttl: float = 15.0) -> None:
        status, detail = await self._script(
            "heartbeat", self._heartbeat, [node_key(name)], [session, session_ttl, time.time()]
        )
        self._check_node_status(name, status, detail)

    async def report_capacity(
        self,
        name: str,
        session: str,
        capacity: Resources,
        *,
        valid_for: float,
        admission_open: bool = True,
        admission_reason: str = "",
        devices: Sequence[str] = (),
        cpu_overcommit: float = 1.0,
    ) -> None:
        """Replace the node's capacity sample (RES-4). ``cpu_overcommit``: how far its CPU reservations may exceed
        its CPU capacity (0: a node that does not say, i.e. one of an earlier version: 1.0, no overcommit)."""
        ratio = cpu_overcommit or 1.0
        if not 1.0 <= ratio <= MAX_CPU_OVERCOMMIT:  # also refuses NaN
            raise InvalidInputError("cpuOvercommit", f"must be between 1 and {MAX_CPU_OVERCOMMIT:g}, got {ratio!r}")
        args: list[ScriptArg] = [
            session,
            capacity.cpu_millis,
            capacity.memory_bytes,
            capacity.disk_bytes,
            time.time() + valid_for,
            "1" if admission_open else "0",
            admission_reason,
            json.dumps(list(devices)),
            repr(ratio),
        ]
        status, detail = await self._script("report capacity", self._report_capacity, [node_key(name)], args)
        self._check_node_status(name, status, detail)

    @staticmethod
    def _check_node_status(name: str, status: int, detail: Any) -> None:
        if status == 1:
            return
        if status == -1:
            raise NotFoundError(f"node {name} is not registered")
        raise SessionRejectedError(f"node {name}: session is not the registered one")

    async def get_node(self, name: str) -> NodeRecord:
        raw = await self._call("get node", lambda: self._redis.hgetall(node_key(name)), writes=False)
        if not raw:
            raise NotFoundError(f"node {name} not found")
        return _node_from_hash(name, {_text(k): _text(v) for k, v in raw.items()})

    async def list_nodes(self) -> list[NodeRecord]:
        names = await self._call("list nodes", lambda: self._redis.smembers(NODE_SET), writes=False)
        nodes = []
        for raw in sorted(names):
            try:
                nodes.append(await self.get_node(_text(raw)))
            except NotFoundError:
                continue
        return nodes

    async def node_reservations(self, name: str) -> dict[str, Resources]:
        raw = await self._call(
            "node reservations", lambda: self._redis.hgetall(node_reservations_key(name)), writes=False
        )
        out = {}
        for env_id, held in raw.items():
            cpu, mem, disk = (int(x) for x in _text(held).split())
            out[_text(env_id)] = Resources(cpu_millis=cpu, memory_bytes=mem, disk_bytes=disk)
        return out


def _node_from_hash(name: str, h: dict[str, str]) -> NodeRecord:
    return NodeRecord(
        name=name,
        address=h.get("address", ""),
        relay_address=h.get("relay_address", ""),
        session=h.get("session", ""),
        session_expires_at=float(h.get("session_expires_at", 0)),
        capacity=Resources(
            cpu_millis=int(h.get("cap_cpu", 0)),
            memory_bytes=int(h.get("cap_mem", 0)),
            disk_bytes=int(h.get("cap_disk", 0)),
        ),
        capacity_valid_until=float(h.get("cap_valid_until", 0)),
        admission_open=h.get("admission") == "1",
        admission_reason=h.get("admission_reason", ""),
        devices=json.loads(h.get("devices") or "[]"),
        reserved=Resources(
            cpu_millis=int(h.get("res_cpu", 0)),
            memory_bytes=int(h.get("res_mem", 0)),
            disk_bytes=int(h.get("res_disk", 0)),
        ),
        checkpoint_capable=h.get("checkpoint_capable") == "1",
        shared_storage=h.get("shared_storage") == "1",
        cpu_overcommit=float(h.get("cpu_overcommit") or 1.0),
        cordoned=h.get("cordoned") == "1",
    )
