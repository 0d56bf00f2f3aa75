"""RST-2/RST-3 with a real adxlet process SIGKILLed while a restart is pending: the restart counters come back
from the Coordinator, the backoff is re-armed by the successor, and the cap still holds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_process import DaemonProcess
from test_node_agent import Api
from test_restart_policy import history

from adx._certs import Identity, issue
from adx.embedded._adx_daemons import render_toml
from adx.model import EnvironmentState

S = EnvironmentState


@pytest.mark.req("RST-2", "RST-3", "NOD-1")
async def test_sigkilled_adxlet_between_restarts_keeps_the_counters(coordinator_cluster, tmp_path: Path) -> None:
    from sbx_helpers import DaemonFactory

    cluster, _ = await coordinator_cluster()
    factory = DaemonFactory(tmp_path / "sandboxd")
    (tmp_path / "sandboxd").mkdir()
    daemon = factory("n1")
    issue(cluster.certs, Identity("node", "n1"))
    capacity = tmp_path / "capacity.json"
    capacity.write_text('{"cpuMillis": 4000, "memoryBytes": 8589934592}')
    config = tmp_path / "node.toml"
    config.write_text(
        render_toml(
            {
                "name": "n1",
                "listen": "127.0.0.1:0",
                "relay_listen": "127.0.0.1:0",
                "coordinator": cluster.target,
                "certs_dir": str(cluster.certs),
                "state_dir": str(tmp_path / "n1-state"),
                "report_interval_seconds": 0.5,
                "capacity_file": str(capacity),
                "runtime": {"socket": str(daemon.socket), "ready_timeout_seconds": 30},
            }
        )
    )
    adxlet = DaemonProcess("node", config, tmp_path / "node.log")
    api = Api(type("NC", (), {"cluster": cluster, "api_credentials": lambda self: _api_credentials(cluster)})())
    adxlet.start()
    try:
        await node_ready(cluster, "n1")
        created = await api.create(
            entrypoint=["sh", "-c", "sleep 1; exit 3"],
            lifecycle={"restartPolicy": {"maxRetries": 2, "initialBackoffSeconds": 2, "maxBackoffSeconds": 8}},
        )
        first = await history(api, created.id, lambda r: r.state is S.FAILED and r.restart_pending, within=60)
        assert first[-1].restart_attempts == 0
        adxlet.kill()  # SIGKILL with the first restart pending
        adxlet.start()
        await node_ready(cluster, "n1")
        seen = await history(api, created.id, lambda r: r.state is S.FAILED and not r.restart_pending, within=90)
        final = seen[-1]
        assert final.restart_attempts == 2, [(r.state.value, r.restart_attempts) for r in seen]
        executions = {r.execution_id for r in first + seen if r.state is S.RUNNING}
        assert len(executions) == 3  # the first run and two restarts, each a new execution
        assert {r.generation for r in first + seen} == {1}
        # Nothing was left running by the killed adxlet or its successor.
        sandboxes = await daemon_client(daemon).list()
        assert not executions & {s.sandbox_id for s in sandboxes}
    finally:
        adxlet.stop()
        await api.close()
        factory.cleanup()


async def node_ready(cluster: Any, name: str, within: float = 60) -> None:
    """Until the node registered (a new session) and reported a capacity the Coordinator can place on."""
    cache = cluster.coordinator.service.cache
    before = cache.nodes[name].session if name in cache.nodes else None
    deadline = time.monotonic() + within
    while True:
        node = cache.nodes.get(name)
        if node is not None and node.session != before and node.admission_open and node.capacity.cpu_millis:
            return
        assert time.monotonic() < deadline, f"node {name} did not register in time"
        await asyncio.sleep(0.05)


def _api_credentials(cluster: Any) -> Any:
    from adx._grpc_tls import channel_credentials

    return channel_credentials(issue(cluster.certs, Identity("api", "main")))


def daemon_client(daemon: Any) -> Any:
    from adx.sandboxd import SandboxdClient

    return SandboxdClient(daemon.socket)
