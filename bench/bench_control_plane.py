"""Control plane at scale (issue 16): one Coordinator process, many real adxlet processes, thousands of Environments.

    uv run python bench/bench_control_plane.py [--nodes 50] [--environments 10000] [--concurrency 32]

Every adxlet is a real ``adx node`` process with the bench-only recording runtime (``[runtime]
bench_record_only = true``: executions are recorded, nothing runs), so what is measured is the control plane
alone: the Coordinator's placement (Lua admission on Redis), the nodes' Starting/Running commits, their reports
and catalog reads (InspectNode every report round), and Redis.

Two phases in one run, each figure beside the same figure of the small phase (the baseline):

1. ``--baseline-nodes`` adxlets (2) and ``--baseline-environments`` (100);
2. the other adxlets start, and Environments are added up to ``--environments`` over ``--nodes``.

Figures: placement+commit throughput (creates/s: N created and committed Running by their nodes, over the wall
time from the first create to the last Running), the create call alone (p50/p99), InspectNode p50/p99 on the
node holding the most Environments (as that node, with its session: what its routine check pays), GetEnvironment
and ListEnvironments latency (which answers at most 1,000 of a tenant's, read from Redis), Redis ``used_memory``
per Environment (INFO memory before and after), Environments not Running after ``--settle`` seconds without
progress, and fixed baselines: a Redis GET round trip and a gRPC Health round trip with mutual TLS on the same channel.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import redis.asyncio as aioredis
from _harness import emit, progress, summarize
from bench_coordinator import timed

from adx._certs import Identity, init_ca, issue
from adx._grpc_tls import channel_credentials
from adx.coordinator import CoordinatorStore
from adx.coordinator._store import env_key
from adx.embedded import EmbeddedRedis
from adx.embedded._adx_daemons import render_toml
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc, health_pb2, health_pb2_grpc

TENANT = "bench"
#: Small requests on generous capacity: placement is never refused, so what is timed is the control plane.
SPEC = json.dumps({"resources": {"cpuMillis": 10, "memoryBytes": 16 * 2**20}})
STATE = re.compile(rb'"state":"([a-z]+)"')
CAPACITY = {"cpuMillis": 1_000_000, "memoryBytes": 2**44, "diskBytes": 2**44}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def rss_bytes(self) -> int:
        try:
            text = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return 0
        return next((int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("VmRSS:")), 0)

    def cpu_seconds(self) -> float:
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn(component: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "adx", component, "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class Bench:
    def __init__(self, base: Path, redis_url: str, args: argparse.Namespace) -> None:
        self.base = base
        self.redis_url = redis_url
        self.args = args
        self.certs = base / "certs"
        self.nodes: dict[str, Proc] = {}
        self.coordinator: Proc | None = None
        self.target = ""
        self.ids: list[str] = []

    # -- processes --------------------------------------------------------------------------------------------
    def start_coordinator(self) -> None:
        init_ca(self.certs)
        issue(self.certs, Identity("coordinator", "main"))
        port = free_port()
        config = self.base / "coordinator.toml"
        config.write_text(
            render_toml(
                {
                    "listen": f"127.0.0.1:{port}",
                    "redis_url": self.redis_url,
                    "certs_dir": str(self.certs),
                    # At load 20-30 on 2 cores a 5 s lease was not renewed in time once: the Coordinator stood
                    # down mid-run (GOAWAY). The bench measures throughput and latency, not failover.
                    "leader_lease_seconds": self.args.leader_lease,
                }
            )
        )
        self.coordinator = Proc("coordinator", spawn("coordinator", config, self.base / "coordinator.log"))
        self.target = f"localhost:{port}"

    def start_node(self, name: str) -> None:
        issue(self.certs, Identity("node", name))
        capacity = self.base / f"{name}-capacity.json"
        capacity.write_text(json.dumps(CAPACITY))
        state_dir = self.base / f"{name}-state"
        config = self.base / f"{name}.toml"
        config.write_text(
            render_toml(
                {
                    "name": name,
                    "listen": f"127.0.0.1:{free_port()}",
                    "relay_listen": f"127.0.0.1:{free_port()}",
                    "coordinator": self.target,
                    "certs_dir": str(self.certs),
                    "state_dir": str(state_dir),
                    "report_interval_seconds": self.args.report_interval,
                    "capacity_file": str(capacity),
                    "degradation_journal": str(state_dir / "journal.sqlite3"),
                    "runtime": {"socket": str(self.base / "no-sandboxd.sock"), "bench_record_only": True},
                }
            )
        )
        self.nodes[name] = Proc(name, spawn("node", config, self.base / f"{name}.log"))

    def stop(self) -> None:
        for proc in [*self.nodes.values(), *([self.coordinator] if self.coordinator else [])]:
            proc.stop()
        for proc in [*self.nodes.values(), *([self.coordinator] if self.coordinator else [])]:
            try:
                proc.process.wait(20)
            except subprocess.TimeoutExpired:
                proc.process.kill()

    # -- phases -----------------------------------------------------------------------------------------------
    async def wait_nodes(self, store: CoordinatorStore, names: list[str], within: float = 600) -> None:
        deadline = time.monotonic() + within
        pending = set(names)
        while pending:
            for name in list(pending):
                with contextlib.suppress(Exception):
                    node = await store.get_node(name)
                    if node.capacity.cpu_millis and node.admission_open and node.session_expires_at > time.time():
                        pending.discard(name)
            dead = [n for n in pending if self.nodes[n].process.poll() is not None]
            if dead:
                raise RuntimeError(f"adxlet {dead[0]} exited; see {self.base / (dead[0] + '.log')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not admitting after {within}s: {sorted(pending)[:5]}")
            await asyncio.sleep(0.5)

    async def fill(self, store: CoordinatorStore, stub: Any, count: int) -> dict[str, Any]:
        """``count`` creates by ``--concurrency`` clients, then until every one is Running."""
        made: list[str] = []
        call_samples: list[float] = []
        queue = iter(range(count))

        retried: list[str] = []

        async def create() -> Any:
            """A create, sent again after a refusal that says "retry" (as the SDK does): on a loaded machine
            Redis may answer late, and the Coordinator then undoes the create and says so."""
            for _ in range(20):
                try:
                    return await stub.CreateEnvironment(pb.CreateEnvironmentRequest(tenant=TENANT, spec_json=SPEC))
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
                        raise
                    retried.append(exc.details() or "")
                    await asyncio.sleep(1.0)
            raise RuntimeError(f"a create was refused 20 times: {retried[-1]}")

        async def client() -> None:
            for _ in queue:
                started = time.perf_counter()
                reply = await create()
                call_samples.append(time.perf_counter() - started)
                made.append(json.loads(reply.environment_json)["id"])

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(self.args.concurrency)))
        created_s = time.perf_counter() - started
        polls, every, last_change, last_running = 0, self.ids + made, time.monotonic(), -1
        while True:
            # From Redis (the authority), not ListEnvironments (it answers at most 1,000 of a tenant's); the docs'
            # state is found by its bytes: parsing 10,000 records took 24 s at load 30.
            polls += 1
            states = await self.states(store, every)
            if states["failed"]:
                raise RuntimeError(f"{states['failed']} Environments failed")
            if states["running"] == len(every):
                break
            if states["running"] != last_running:
                last_running, last_change = states["running"], time.monotonic()
            elif time.monotonic() - last_change > self.args.settle:
                break  # stuck: reported below, and the latencies are measured anyway
            await asyncio.sleep(2.0)
        running_s = time.perf_counter() - started
        self.ids += made
        stuck = {state: n for state, n in states.items() if state != "running" and n}
        return {
            "environments_added": count,
            "created_per_second": round(count / created_s, 1),
            "placed_and_running_per_second": round(count / running_s, 1),
            "seconds_to_all_running": round(running_s, 1),
            "create_call": summarize(call_samples),
            "redis_polls_while_waiting": polls,
            "not_running_after_settle": stuck,
            "creates_retried": len(retried),
            "retry_reasons": sorted(set(retried))[:3],
        }

    async def states(self, store: CoordinatorStore, ids: list[str]) -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        for start in range(0, len(ids), 1000):
            async with store._redis.pipeline(transaction=False) as pipe:
                for env_id in ids[start : start + 1000]:
                    pipe.hget(env_key(env_id), "doc")
                docs = await pipe.execute()
            for doc in docs:
                found = STATE.search(doc or b"")
                counts[found.group(1).decode() if found else "gone"] += 1
        return counts

    async def measure(self, store: CoordinatorStore, api_stub: Any, redis: Any, memory_before: int) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for name in self.nodes:
            counts[name] = len(await store.node_reservations(name))
        busiest = max(counts, key=lambda n: counts[n])
        node = await store.get_node(busiest)
        node_channel = grpc.aio.secure_channel(
            self.target, channel_credentials(issue(self.certs, Identity("node", busiest)))
        )
        node_stub = coordinator_pb2_grpc.CoordinatorStub(node_channel)
        health = health_pb2_grpc.HealthStub(node_channel)

        async def inspect() -> None:
            reply = await node_stub.InspectNode(pb.InspectNodeRequest(node=busiest, session=node.session))
            assert len(reply.environment_json) == counts[busiest]

        async def get() -> None:
            await api_stub.GetEnvironment(pb.EnvironmentRequest(tenant=TENANT, environment_id=self.ids[-1]))

        async def listing() -> None:
            await api_stub.ListEnvironments(pb.ListEnvironmentsRequest(tenant=TENANT))

        async def health_call() -> None:
            await health.Check(health_pb2.HealthCheckRequest())

        async def redis_get() -> None:
            await redis.get("bench:nothing")

        calls = self.args.calls
        coordinator = self.coordinator
        assert coordinator is not None

        async def with_cpu(fn: Any) -> dict[str, Any]:
            """Latency, and the Coordinator's CPU per call (its process, so also what it did meanwhile: the
            adxlets' reports and checks; compare with the Health baseline's figure of the same phase)."""
            cpu = coordinator.cpu_seconds()
            samples = await timed(calls, fn)
            return summarize(samples) | {
                "coordinator_cpu_ms_per_call": round((coordinator.cpu_seconds() - cpu) * 1000 / calls, 3)
            }

        await inspect()
        figures = {
            "nodes": len(self.nodes),
            "environments": len(self.ids),
            "inspected_node_holds": counts[busiest],
            "environments_per_node_min_max": [min(counts.values()), max(counts.values())],
            "inspect_node": await with_cpu(inspect),
            "get_environment": summarize(await timed(calls, get)),
            "list_environments_of_tenant_first_1000": summarize(await timed(max(calls // 10, 5), listing)),
            "baseline_grpc_health_mtls": await with_cpu(health_call),
            "baseline_redis_get": summarize(await timed(calls, redis_get)),
        }
        await node_channel.close(None)
        memory_after = int((await redis.info("memory"))["used_memory"])
        figures["redis_used_memory_bytes"] = memory_after
        return figures


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="adx-bench-cp-") as tmp:
        base = Path(tmp)
        redis_server = EmbeddedRedis(base / "redis")
        info = redis_server.start()
        bench = Bench(base, info.url, args)
        try:
            bench.start_coordinator()
            store = CoordinatorStore.from_url(info.url)
            redis = aioredis.Redis.from_url(info.url)
            channel = grpc.aio.secure_channel(
                bench.target, channel_credentials(issue(bench.certs, Identity("api", "main")))
            )
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            names = [f"n{i:02d}" for i in range(args.nodes)]
            small, rest = names[: args.baseline_nodes], names[args.baseline_nodes :]
            progress(f"phase 1: {len(small)} adxlets, {args.baseline_environments} Environments")
            for name in small:
                bench.start_node(name)
            await bench.wait_nodes(store, small)
            memory_empty = int((await redis.info("memory"))["used_memory"])
            phase1 = await bench.fill(store, stub, args.baseline_environments)
            phase1 |= await bench.measure(store, stub, redis, memory_empty)
            phase1["redis_bytes_per_environment"] = round(
                (phase1["redis_used_memory_bytes"] - memory_empty) / args.baseline_environments
            )
            progress(f"phase 1 figures: {json.dumps(phase1)}")
            progress(f"phase 2: {len(rest)} more adxlets")
            cpu_before = {n: p.cpu_seconds() for n, p in bench.nodes.items()}
            for name in rest:
                bench.start_node(name)
                await asyncio.sleep(args.stagger)
            await bench.wait_nodes(store, rest)
            rss = [bench.nodes[n].rss_bytes() for n in names]
            memory_before = int((await redis.info("memory"))["used_memory"])
            added = args.environments - args.baseline_environments
            progress(f"phase 2: {added} more Environments over {len(names)} nodes")
            coordinator = bench.coordinator
            assert coordinator is not None
            coordinator_cpu = coordinator.cpu_seconds()
            phase2 = await bench.fill(store, stub, added)
            phase2["coordinator_cpu_ms_per_create"] = round(
                (coordinator.cpu_seconds() - coordinator_cpu) * 1000 / added, 2
            )
            phase2 |= await bench.measure(store, stub, redis, memory_before)
            phase2["redis_bytes_per_environment"] = round((phase2["redis_used_memory_bytes"] - memory_before) / added)
            adxlets_cpu = sum(p.cpu_seconds() for p in bench.nodes.values()) - sum(cpu_before.values())
            await channel.close(None)
            await store.close()
            await redis.aclose()
        except BaseException:
            for log in ("coordinator.log", "n00.log"):
                with contextlib.suppress(OSError):
                    progress(f"{log}, last lines:\n" + "\n".join((base / log).read_text().splitlines()[-15:]))
            raise
        finally:
            bench.stop()
            redis_server.stop()
    return {
        "setup": {
            "adxlet_processes": args.nodes,
            "runtime": "recording (bench only): nothing runs",
            "report_interval_seconds": args.report_interval,
            "coordinator_leader_lease_seconds": args.leader_lease,
            "concurrency": args.concurrency,
            "adxlet_rss_mib_mean_max": [round(sum(rss) / len(rss) / 2**20, 1), round(max(rss) / 2**20, 1)],
            "adxlets_cpu_seconds_phase2": round(adxlets_cpu, 1),
            "load_average": os.getloadavg(),
        },
        "baseline_small": phase1,
        "figure_at_scale": phase2,
        "goal": "InspectNode p99 <= 20 ms at 10,000 Environments over 50 nodes",
        "goal_met": phase2["inspect_node"]["p99_ms"] <= 20.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--environments", type=int, default=10_000)
    parser.add_argument("--baseline-nodes", type=int, default=2)
    parser.add_argument("--baseline-environments", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--calls", type=int, default=300, help="timed calls per latency figure")
    parser.add_argument("--report-interval", type=float, default=5.0, help="the adxlets' report_interval_seconds")
    parser.add_argument("--settle", type=float, default=90.0, help="stop waiting for Running after this long unchanged")
    parser.add_argument("--leader-lease", type=float, default=30.0, help="the Coordinator's leader_lease_seconds")
    parser.add_argument("--stagger", type=float, default=0.5, help="seconds between adxlet starts (2 cores)")
    args = parser.parse_args()
    if not 0 < args.baseline_nodes <= args.nodes or not 0 < args.baseline_environments < args.environments:
        parser.error("need 0 < baseline-nodes <= nodes and 0 < baseline-environments < environments")
    emit("control_plane", asyncio.run(run(args)))


if __name__ == "__main__":
    main()
