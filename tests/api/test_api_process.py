"""`adx api` as a real process: SIGKILL it mid-request, restart it, nothing is lost or duplicated."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from apistack import STEP, ApiProcess, free_port, write_api_config

import adx
from adx.api import ApiConfig, CoordinatorClient
from adx.model import new_id
from adx.proto import coordinator_pb2 as pb

SPEC = {"resources": {"cpuMillis": 500, "memoryBytes": 2**28}, "metadata": {"attempt": "first"}}


async def test_sigkill_mid_create_then_restart_keeps_the_environment_and_the_retry_returns_it(
    coordinator_cluster, tmp_path: Path
) -> None:
    cluster, _ = await coordinator_cluster()
    # A node whose gRPC address accepts connections and never answers: the Coordinator's admission call
    # hangs until its node RPC timeout, so the create is really in flight when the API process dies.
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    silent_address = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    channel, stub = cluster.stub("n1")
    session = new_id("ses")
    await stub.RegisterNode(pb.RegisterNodeRequest(node="n1", session=session, address=silent_address), timeout=STEP)
    await stub.ReportCapacity(
        pb.ReportCapacityRequest(
            node="n1",
            session=session,
            capacity_json='{"cpuMillis": 8000, "memoryBytes": 17179869184}',
            valid_for_seconds=600,
            admission_open=True,
        ),
        timeout=STEP,
    )

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config_path = write_api_config(tmp_path / "api.toml", cluster, port)
    coordinator = CoordinatorClient.from_config(ApiConfig(coordinator=cluster.target, certs_dir=cluster.certs))
    key = await coordinator.create_tenant("acme")
    await coordinator.close()
    api = ApiProcess(config_path, tmp_path / "api.log")
    try:
        await asyncio.to_thread(api.start, url)

        def first_attempt() -> Any:
            try:
                return httpx.post(
                    f"{url}/v1/environments",
                    json=SPEC,
                    headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "create-1"},
                    timeout=STEP,
                )
            except httpx.HTTPError as exc:
                return exc

        attempt = asyncio.create_task(asyncio.to_thread(first_attempt))
        environments = cluster.coordinator.service.cache.environments
        deadline = time.monotonic() + STEP
        # Stored, and the Coordinator's admission call has reached the silent node: the request is in flight.
        while not (environments and held):
            assert time.monotonic() < deadline, f"create not in flight (stored: {bool(environments)})"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert not attempt.done(), "the create answered before the kill"
        api.kill()  # SIGKILL while the request is in flight
        lost = await attempt
        assert isinstance(lost, httpx.HTTPError), lost  # the client never got an answer

        await asyncio.to_thread(api.start, url)

        def retry() -> tuple[str, list[str], dict[str, str]]:
            with adx.Client(api_url=url, api_key=key) as client:
                again = client.environments.create(
                    cpu=0.5, memory=2**28, metadata={"attempt": "first"}, idempotency_key="create-1", wait=False
                )
                return again.id, [e.id for e in client.environments.list()], client.environments.get(again.id).metadata

        env_id, listed, metadata = await asyncio.to_thread(retry)
        (stored,) = environments
        assert env_id == stored and listed == [stored]  # the same Environment, exactly one
        assert metadata == {"attempt": "first"}
        record = await cluster.coordinator.store.get_environment(stored)
        assert record.state.value == "pending" and record.node == "n1" and record.revision == 1
    finally:
        api.kill()
        await channel.close()
        for writer in held:
            writer.close()
        silent.close()
