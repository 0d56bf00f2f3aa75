"""Coordinator failover: time from SIGKILL of the active replica to the first successful call through the
failover-aware client (``adx._coordinator_channel``), over ``--kills`` kills of two ``adx coordinator``
processes on one Redis (the killed one is restarted as the standby before the next kill).

    uv run python bench/bench_failover.py [--kills 10] [--lease 5] [--freezes 3]

Baseline (same run): a plain call round trip on the same client in steady state, and the lease TTL (what a
takeover would wait without the dead-holder detection). ``--freezes``: also SIGSTOP the active replica that
many times (the frozen one keeps its port open and its Redis connection: the standby waits for the TTL).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from _harness import emit, progress, summarize

from adx._certs import Identity, init_ca, issue
from adx._coordinator_channel import coordinator_channel
from adx._grpc_tls import channel_credentials
from adx.embedded import EmbeddedRedis
from adx.embedded._adx_daemons import render_toml
from adx.embedded._process import pick_free_port
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc


class Replica:
    def __init__(self, name: str, config: dict[str, object], directory: Path) -> None:
        self.target = "localhost:" + str(config["listen"]).rpartition(":")[2]
        self.config = directory / f"{name}.toml"
        self.config.write_text(render_toml(config))
        self.log = directory / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "adx", "coordinator", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def standing_by(self) -> int:
        return self.log.read_text(errors="replace").count("standing by")

    def active_terms(self) -> int:
        return self.log.read_text(errors="replace").count("coordinator active")

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


async def wait(check, within: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        await asyncio.sleep(0.02)


async def main(kills: int, lease: float, freezes: int) -> None:
    with tempfile.TemporaryDirectory(prefix="adx-bench-") as tmp:
        directory = Path(tmp)
        redis_server = EmbeddedRedis(directory / "redis")
        info = redis_server.start()
        replicas: list[Replica] = []
        try:
            certs = directory / "certs"
            init_ca(certs)
            issue(certs, Identity("coordinator", "main"))
            for name in ("a", "b"):
                config: dict[str, object] = {
                    "listen": f"127.0.0.1:{pick_free_port('127.0.0.1')}",
                    "redis_url": info.url,
                    "certs_dir": str(certs),
                    "leader_lease_seconds": lease,
                }
                replicas.append(Replica(name, config, directory))
            targets = [replica.target for replica in replicas]
            channel = coordinator_channel(targets, channel_credentials(issue(certs, Identity("api", "main"))))
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            replicas[0].start()
            await stub.CreateTenant(pb.CreateTenantRequest(name="bench"), timeout=60)
            replicas[1].start()
            await wait(lambda: replicas[1].standing_by() >= 1)

            async def call() -> None:
                await stub.ListEnvironments(pb.ListEnvironmentsRequest(tenant="bench"), timeout=2)

            baseline = []
            for _ in range(300):
                start = time.perf_counter()
                await call()
                baseline.append(time.perf_counter() - start)

            async def first_success(since: float) -> float:
                while True:
                    try:
                        await call()
                        return time.perf_counter() - since
                    except grpc.aio.AioRpcError:
                        await asyncio.sleep(0.005)

            def active() -> Replica:
                by_target = dict(zip(targets, replicas, strict=True))
                assert channel.active_target is not None
                return by_target[channel.active_target]

            kill_samples: list[float] = []
            for round_ in range(kills):
                victim = active()
                other = replicas[1 - replicas.index(victim)]
                terms = other.active_terms()
                since = time.perf_counter()
                victim.signal(signal.SIGKILL)
                kill_samples.append(await first_success(since))
                assert other.active_terms() == terms + 1
                progress(f"kill {round_ + 1}/{kills}: {kill_samples[-1]:.2f} s")
                assert victim.process is not None
                victim.process.wait(10)
                seen = victim.standing_by()
                victim.start()
                await wait(lambda v=victim, s=seen: v.standing_by() > s)  # type: ignore[misc]

            freeze_samples: list[float] = []
            for round_ in range(freezes):
                victim = active()
                since = time.perf_counter()
                victim.signal(signal.SIGSTOP)
                freeze_samples.append(await first_success(since))
                progress(f"freeze {round_ + 1}/{freezes}: {freeze_samples[-1]:.2f} s")
                seen = victim.standing_by()
                victim.signal(signal.SIGCONT)
                await wait(lambda v=victim, s=seen: v.standing_by() > s)  # type: ignore[misc]
            await channel.close()
        finally:
            for replica in replicas:
                replica.stop()
            redis_server.stop()
    figures: dict[str, object] = {
        "figure": {
            "failover_after_sigkill": {
                **summarize(kill_samples, "s"),
                "max_s": round(max(kill_samples), 3),
            }
        },
        "baseline": {
            "plain_call_round_trip_mtls": summarize(baseline),
            "leader_lease_seconds": lease,
            "renew_interval_seconds": round(lease / 3, 3),
        },
        "goal": "failover p50 < 3 s after SIGKILL with the default 5 s lease",
    }
    if freeze_samples:
        figures["figure"]["failover_after_sigstop"] = {  # type: ignore[index]
            **summarize(freeze_samples, "s"),
            "max_s": round(max(freeze_samples), 3),
        }
    emit("coordinator_failover", figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--lease", type=float, default=5.0, help="leader_lease_seconds of both replicas")
    parser.add_argument("--freezes", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.kills, args.lease, args.freezes))
