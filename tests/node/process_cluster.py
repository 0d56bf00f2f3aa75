"""A cluster of real daemon processes for fault tests: a Coordinator process (so it can be SIGSTOPped and
SIGKILLed) on a private Redis, one sandboxd and one ``adx node`` process per node."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import redis.asyncio as aioredis
from daemon_process import DaemonProcess

from adx._certs import Identity, client_ssl_context, init_ca, issue
from adx._grpc_tls import channel_credentials
from adx._node_client import NodeClients
from adx.embedded import EmbeddedRedis
from adx.embedded._adx_daemons import render_toml
from adx.model import EnvironmentRecord


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ProcessNode:
    name: str
    sandboxd: Any  # sbx_helpers.Daemon
    adxlet: DaemonProcess
    listen: str
    relay: str
    state_dir: Path
    journal: Path


@dataclass
class ProcessCluster:
    base: Path
    redis: EmbeddedRedis
    certs: Path
    coordinator: DaemonProcess
    coordinator_address: str
    nodes: dict[str, ProcessNode] = field(default_factory=dict)

    def api_credentials(self) -> grpc.ChannelCredentials:
        return channel_credentials(issue(self.certs, Identity("api", "main")))

    def node_clients(self, rpc_timeout: float = 10.0) -> NodeClients:
        return NodeClients(self.api_credentials(), rpc_timeout)

    def relay_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(verify=client_ssl_context(issue(self.certs, Identity("api", "main"))), timeout=60)

    async def redis_record(self, env_id: str) -> dict[str, Any] | None:
        """The Environment's record as Redis holds it (the authority), read straight from Redis."""
        from adx.coordinator._store import env_key

        info = self.redis.read_info()
        assert info is not None
        client = aioredis.Redis.from_url(info.url, decode_responses=True)
        try:
            raw = await client.hget(env_key(env_id), "doc")
        finally:
            await client.aclose()
        return json.loads(raw) if raw else None

    async def run(self, node: str, env_id: str, argv: list[str]) -> tuple[int, str, str]:
        """A command through the node's Relay (as the Ingress sends it): (status, stdout, body)."""
        relay = self.nodes[node].relay.replace("127.0.0.1", "localhost")
        async with self.relay_client() as client:
            response = await client.post(f"https://{relay}/{env_id}/v1/commands", json={"argv": argv})
        if response.status_code != 200:
            return response.status_code, "", response.text
        frames = [json.loads(line) for line in response.text.splitlines() if line]
        stdout = "".join(f.get("data", "") for f in frames if f.get("stream") == "stdout")
        return 200, stdout, response.text

    async def run_when_served(
        self, node: str, env_id: str, argv: list[str], within: float = 30
    ) -> tuple[int, str, str]:
        """``run``, asked again while the node answers 503 or its Relay does not listen yet (it is still
        recovering after a restart: on a loaded machine the Relay listens seconds after the catalog is back)."""
        deadline = time.monotonic() + within
        while True:
            try:
                status, stdout, body = await self.run(node, env_id, argv)
            except httpx.ConnectError:
                if time.monotonic() > deadline:
                    raise
                status, stdout, body = 503, "", "the Relay does not listen yet"
            if status != 503 or time.monotonic() > deadline:
                return status, stdout, body
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.adxlet.stop()
        self.coordinator.stop()


def start_process_cluster(
    base: Path,
    redis: EmbeddedRedis,
    factory: Any,
    nodes: tuple[str, ...] = ("n1",),
    *,
    node_settings: dict[str, Any] | None = None,
    coordinator_settings: dict[str, Any] | None = None,
) -> ProcessCluster:
    certs = base / "certs"
    init_ca(certs)
    issue(certs, Identity("coordinator", "main"))
    info = redis.read_info()
    assert info is not None
    port = free_port()
    coordinator_toml = base / "coordinator.toml"
    coordinator_toml.write_text(
        render_toml(
            {
                "listen": f"127.0.0.1:{port}",
                "redis_url": info.url,
                "certs_dir": str(certs),
                "session_ttl_seconds": 30.0,
                "redis_timeout_seconds": 2.0,
                "node_rpc_timeout_seconds": 5.0,
                **(coordinator_settings or {}),
            }
        )
    )
    coordinator = DaemonProcess("coordinator", coordinator_toml, base / "coordinator.log")
    coordinator.start()
    cluster = ProcessCluster(base, redis, certs, coordinator, f"localhost:{port}")
    for name in nodes:
        daemon = factory(name)
        issue(certs, Identity("node", name))
        capacity = base / f"{name}-capacity.json"
        capacity.write_text('{"cpuMillis": 8000, "memoryBytes": 17179869184}')
        listen, relay = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        state_dir = base / f"{name}-state"
        journal = state_dir / "journal.sqlite3"
        config = base / f"{name}.toml"
        config.write_text(
            render_toml(
                {
                    "name": name,
                    "listen": listen,
                    "relay_listen": relay,
                    "coordinator": cluster.coordinator_address,
                    "certs_dir": str(certs),
                    "state_dir": str(state_dir),
                    "report_interval_seconds": 0.5,
                    "rpc_timeout_seconds": 1.0,
                    "capacity_file": str(capacity),
                    "degradation_journal": str(journal),
                    "runtime": {"socket": str(daemon.socket), "ready_timeout_seconds": 30},
                    **(node_settings or {}),
                }
            )
        )
        adxlet = DaemonProcess("node", config, base / f"{name}.log")
        adxlet.start()
        cluster.nodes[name] = ProcessNode(name, daemon, adxlet, listen, relay, state_dir, journal)
    return cluster


async def wait_for(predicate: Any, within: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await predicate() if asyncio.iscoroutinefunction(predicate) else predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {within}s waiting for {what}"
        await asyncio.sleep(interval)


def record_of(doc: dict[str, Any] | None) -> EnvironmentRecord | None:
    return EnvironmentRecord.model_validate(doc) if doc is not None else None
