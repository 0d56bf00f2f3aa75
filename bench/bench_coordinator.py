"""Coordinator: InspectNode with N Environments on one node, served from the in-memory caches.

    uv run python bench/bench_coordinator.py [--environments 200] [--calls 300]

Baseline (same run, same Redis): fetching the same N records straight from Redis in one pipeline, which is
what InspectNode would cost without its caches (CRD-2), and a gRPC Health round trip on the same channel
(the fixed cost of a call with mutual TLS).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import grpc
from _harness import emit, progress, summarize

from adx._certs import Identity, init_ca, issue
from adx._grpc_tls import channel_credentials
from adx.config import CoordinatorConfig
from adx.coordinator import CoordinatorStore
from adx.coordinator._daemon import start_coordinator
from adx.coordinator._store import env_key
from adx.embedded import EmbeddedRedis
from adx.model import EnvironmentRecord, EnvironmentSpec, EnvironmentState, Resources, new_id
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc, health_pb2, health_pb2_grpc


async def timed(calls: int, fn) -> list[float]:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    return samples


async def main(environments: int, calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="adx-bench-") as tmp:
        redis_server = EmbeddedRedis(Path(tmp) / "redis")
        info = redis_server.start()
        try:
            certs = Path(tmp) / "certs"
            init_ca(certs)
            issue(certs, Identity("coordinator", "main"))
            store = CoordinatorStore.from_url(info.url)
            session = new_id("ses")
            await store.register_node("n1", session=session, address="x:1", session_ttl=600)
            await store.report_capacity("n1", session, Resources(cpu_millis=10**9, memory_bytes=10**15), valid_for=600)
            progress(f"creating {environments} environments")
            ids = []
            for _ in range(environments):
                now = time.time()
                record = EnvironmentRecord(
                    id=new_id("env"),
                    tenant="acme",
                    spec=EnvironmentSpec(resources=Resources(cpu_millis=100, memory_bytes=2**27)),
                    state=EnvironmentState.RUNNING,
                    node="n1",
                    generation=1,
                    revision=1,
                    created_at=now,
                    updated_at=now,
                )
                ids.append((await store.create_environment(record)).record.id)
            coordinator = await start_coordinator(
                CoordinatorConfig(listen="127.0.0.1:0", redis_url=info.url, certs_dir=certs, session_ttl_seconds=600)
            )
            channel = grpc.aio.secure_channel(
                f"localhost:{coordinator.port}", channel_credentials(issue(certs, Identity("node", "n1")))
            )
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            await stub.RegisterNode(pb.RegisterNodeRequest(node="n1", session=session, address="x:1"))
            health = health_pb2_grpc.HealthStub(channel)

            async def inspect() -> None:
                reply = await stub.InspectNode(pb.InspectNodeRequest(node="n1", session=session))
                assert len(reply.environment_json) == environments

            async def from_redis() -> None:
                async with store._redis.pipeline(transaction=False) as pipe:
                    for env_id in ids:
                        pipe.hget(env_key(env_id), "doc")
                    docs = await pipe.execute()
                records = [EnvironmentRecord.model_validate_json(doc) for doc in docs]
                assert len(records) == environments

            async def health_call() -> None:
                await health.Check(health_pb2.HealthCheckRequest())

            progress(f"{calls} InspectNode calls")
            await inspect()
            inspect_samples = await timed(calls, inspect)
            redis_samples = await timed(calls, from_redis)
            health_samples = await timed(calls, health_call)
            await channel.close(None)
            await coordinator.stop(grace=None)
            await store.close()
        finally:
            redis_server.stop()
    figure = summarize(inspect_samples)
    baseline = summarize(redis_samples)
    emit(
        "coordinator",
        {
            "environments_on_node": environments,
            "figure": {"inspect_node_from_caches": figure},
            "baseline": {
                "same_records_from_redis_pipeline": baseline,
                "grpc_health_round_trip_mtls": summarize(health_samples),
            },
            "ratio_p50_inspect_over_redis": round(figure["p50_ms"] / baseline["p50_ms"], 3),
            "goal": "InspectNode p50 <= 20 ms with 200 Environments",
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--environments", type=int, default=200)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(main(args.environments, args.calls))
