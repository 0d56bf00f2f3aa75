"""Heartbeat delay while one Environment's backend hangs (NOD-4), beside the same node with nothing hanging.

    uv run --frozen --no-sync python bench/bench_heartbeat.py [--seconds 30] [--environments 4] [--interval 0.5]

Real parts, started as ``tests/conftest.py``'s ``node_cluster`` fixture does: a Coordinator (in-process gRPC
server, mutual TLS) on a real Redis, one in-process ``NodeAgent`` (report interval ``--interval``) on a real
sandboxd (``tests/helpers/sbx_helpers.DaemonFactory``), ``--environments`` Running Environments created through
the Coordinator's CreateEnvironment (api certificate).

The Coordinator's side is observed: every Heartbeat call of the node is time-stamped on arrival (a wrapper
around the Coordinator store's ``heartbeat``). The delay is the interval between consecutive heartbeats minus
the configured period.

- baseline (first, ``--seconds``): nothing hangs;
- hang (then, ``--seconds``): every process of ONE Environment's sandbox (its cgroup's procs: execd, its
  init and children) is SIGSTOPped, then operations that block on it are started: pauses through the
  Coordinator (PauseEnvironment -> the node closes its execd's admission, which never answers; a new pause
  each time one gives up) and three commands sent to it through the node's Relay. The figures list how each
  ended, and whether the processes were still stopped when the window ended.

Both the Coordinator and the node run on this process's one event loop (as in the tests): a blocking call on
the node would delay the Coordinator's handling too, and shows up here all the same.

NOD-4 holds when the hang's delay stays within one report period. Everything (sandboxes, sandboxd, Redis) is
cleaned up at the end. Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
from _harness import emit, percentile, progress

from adx._certs import Identity, client_ssl_context, init_ca, issue
from adx._grpc_errors import from_rpc_error
from adx._grpc_tls import channel_credentials
from adx.config import CoordinatorConfig, NodeConfig
from adx.coordinator._daemon import start_coordinator
from adx.embedded import EmbeddedRedis
from adx.model import EnvironmentRecord, EnvironmentState
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))

NODE = "n1"
TENANT = "acme"


def delays(beats: list[float], period: float) -> dict[str, Any]:
    intervals = [b - a for a, b in itertools.pairwise(beats)]
    if not intervals:
        return {"heartbeats": len(beats), "error": "fewer than two heartbeats"}
    late = [i - period for i in intervals]
    return {
        "heartbeats": len(beats),
        "intervals": len(intervals),
        "delay_p50_ms": round(percentile(late, 50) * 1e3, 1),
        "delay_p99_ms": round(percentile(late, 99) * 1e3, 1),
        "delay_max_ms": round(max(late) * 1e3, 1),
        "interval_max_ms": round(max(intervals) * 1e3, 1),
        "intervals_over_two_periods": sum(1 for i in intervals if i > 2 * period),
        "within_one_period": max(late) <= period,
    }


class Api:
    """The Coordinator's API-facing calls, as the API server makes them (api certificate)."""

    def __init__(self, target: str, certs: Path) -> None:
        self.channel = grpc.aio.secure_channel(target, channel_credentials(issue(certs, Identity("api", "main"))))
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self.channel)

    async def call(self, what: str, coro: Any) -> EnvironmentRecord:
        try:
            reply = await coro
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, what) from None
        return EnvironmentRecord.model_validate_json(reply.environment_json)

    async def create(self) -> EnvironmentRecord:
        body = {"resources": {"cpuMillis": 250, "memoryBytes": 256 * 2**20}}
        request = pb.CreateEnvironmentRequest(tenant=TENANT, spec_json=json.dumps(body))
        return await self.call("create", self.stub.CreateEnvironment(request))

    async def get(self, env_id: str) -> EnvironmentRecord:
        request = pb.EnvironmentRequest(tenant=TENANT, environment_id=env_id)
        return await self.call("get", self.stub.GetEnvironment(request))

    async def pause(self, env_id: str, within: float) -> EnvironmentRecord:
        request = pb.EnvironmentRequest(tenant=TENANT, environment_id=env_id)
        return await self.call("pause", self.stub.PauseEnvironment(request, timeout=within))

    async def wait_running(self, env_id: str, within: float = 60.0) -> EnvironmentRecord:
        deadline = time.monotonic() + within
        while True:
            record = await self.get(env_id)
            if record.state is EnvironmentState.RUNNING:
                return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"{env_id} is {record.state.value} after {within:g}s")
            await asyncio.sleep(0.05)


def process_state(pid: int) -> str:
    """The one-letter state of ``pid`` (T: stopped), from /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "gone"


def signal_all(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def main(seconds: float, environments: int, interval: float) -> None:
    from sbx_helpers import DaemonFactory  # the sandboxd test harness: unique cgroup parent, full cleanup

    from adx.node._agent import NodeAgent

    tmp = Path(tempfile.mkdtemp(prefix="adx-bench-hb-", dir="/var/tmp"))
    (tmp / "sandboxd").mkdir()
    factory = DaemonFactory(tmp / "sandboxd")
    redis_server = EmbeddedRedis(tmp / "redis")
    coordinator = agent = api = None
    frozen: set[int] = set()
    blocked: list[asyncio.Task[Any]] = []
    try:
        info = redis_server.start()
        certs = tmp / "certs"
        init_ca(certs)
        issue(certs, Identity("coordinator", "main"))
        coordinator = await start_coordinator(
            CoordinatorConfig(listen="127.0.0.1:0", redis_url=info.url, certs_dir=certs, session_ttl_seconds=30)
        )
        # The Coordinator's view: each Heartbeat of the node, time-stamped on arrival.
        beats: list[float] = []
        store = coordinator.service.store
        heartbeat = store.heartbeat

        async def observed_heartbeat(name: str, session: str, session_ttl: float = 15.0) -> None:
            if name == NODE:
                beats.append(time.monotonic())
            await heartbeat(name, session, session_ttl)

        store.heartbeat = observed_heartbeat  # type: ignore[method-assign]

        progress("starting sandboxd and the node")
        daemon = factory(NODE)
        issue(certs, Identity("node", NODE))
        capacity = tmp / "capacity.json"
        capacity.write_text(json.dumps({"cpuMillis": 8000, "memoryBytes": 16 * 2**30}))
        agent = NodeAgent(
            NodeConfig(
                name=NODE,
                listen="127.0.0.1:0",
                relay_listen="127.0.0.1:0",
                coordinator=f"localhost:{coordinator.port}",
                certs_dir=certs,
                state_dir=tmp / "node-state",
                report_interval_seconds=interval,
                capacity_file=capacity,
                runtime={"socket": daemon.socket, "ready_timeout_seconds": 30},
            )
        )
        await agent.start()
        api = Api(f"localhost:{coordinator.port}", certs)
        progress(f"creating {environments} environments")
        deadline = time.monotonic() + 30
        while True:  # placement needs the node's first capacity report
            try:
                first = await api.create()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        created = [first] + [await api.create() for _ in range(environments - 1)]
        running = [await api.wait_running(record.id) for record in created]

        progress(f"baseline: {seconds:g} s, nothing hangs")
        failures = agent.reporter.state.failures
        beats.clear()
        await asyncio.sleep(seconds)
        baseline_beats = list(beats)
        baseline_failures = agent.reporter.state.failures - failures

        victim = running[0]
        assert victim.execution_id is not None
        frozen = daemon.cgroup_procs(victim.execution_id)
        if not frozen:
            raise RuntimeError(f"no processes in the cgroup of sandbox {victim.execution_id}")
        stopped = len(frozen)
        progress(f"hang: SIGSTOP {len(frozen)} processes of {victim.id}, pause it and send it commands")
        signal_all(frozen, signal.SIGSTOP)
        relay = agent.reporter.relay_address.replace("127.0.0.1", "localhost")
        relay_client = httpx.AsyncClient(
            verify=client_ssl_context(issue(certs, Identity("api", "main"))), timeout=seconds + 60
        )
        window_open = True
        attempts: list[str] = []
        opened = time.monotonic() + interval  # when the window opens (t=0 in the reported attempts)

        async def keep_pausing() -> None:
            """A pause through the Coordinator, again each time one gives up, while the window is open."""
            while window_open:
                start = time.monotonic()
                try:
                    outcome = (await api.pause(victim.id, within=seconds + 60)).state.value
                except Exception as exc:
                    outcome = f"{type(exc).__name__}: {str(exc)[-90:]}"
                end = time.monotonic()
                attempts.append(f"t={end - opened:+.1f} s, took {end - start:.1f} s: {outcome}")

        async def command() -> str:
            start = time.monotonic()
            try:
                response = await relay_client.post(f"https://{relay}/{victim.id}/v1/commands", json={"argv": ["true"]})
                outcome = f"HTTP {response.status_code}"
            except Exception as exc:
                outcome = type(exc).__name__
            return f"after {time.monotonic() - start:.1f} s: {outcome}"

        pauser = asyncio.create_task(keep_pausing(), name="blocked-pauses")
        commands = [asyncio.create_task(command(), name=f"blocked-command-{i}") for i in range(3)]
        blocked.extend([pauser, *commands])
        await asyncio.sleep(interval)  # the operations reach the node before the window opens
        failures = agent.reporter.state.failures
        beats.clear()
        opened = time.monotonic()
        await asyncio.sleep(seconds)
        hang_beats = list(beats)
        hang_failures = agent.reporter.state.failures - failures
        window_open = False
        attempts_in_window = len(attempts)
        still_stopped = sum(1 for pid in frozen if process_state(pid) == "T")
        controller = agent.controllers.get(victim.id)
        victim_state = controller.state.value if controller is not None else "?"
        same_execution = controller is not None and controller.record.execution_id == victim.execution_id
        pause_pending = not pauser.done()
        commands_blocked = sum(1 for task in commands if not task.done())

        progress("SIGCONT, cleaning up")
        signal_all(frozen, signal.SIGCONT)
        frozen = set()
        await asyncio.wait(blocked, timeout=30)
        await relay_client.aclose()
        final = await api.get(victim.id)
    finally:
        signal_all(frozen, signal.SIGCONT)
        for task in blocked:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if api is not None:
            await api.channel.close(None)
        if agent is not None:
            with contextlib.suppress(Exception):
                await agent.stop()
        if coordinator is not None:
            with contextlib.suppress(Exception):
                await coordinator.stop(grace=None)
        factory.cleanup()
        redis_server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    figure = delays(hang_beats, interval)
    baseline = delays(baseline_beats, interval)
    emit(
        "heartbeat",
        {
            "report_interval_s": interval,
            "window_s": seconds,
            "environments": environments,
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
            "figure": {
                "one_environment_hanging": {**figure, "report_failures": hang_failures},
                "hang": {
                    "sigstopped_processes": stopped,
                    "still_stopped_at_window_end": still_stopped,
                    "victim_on_node_at_window_end": f"{victim_state}, same execution: {same_execution}",
                    "pause_attempts_ended_in_window": attempts[:attempts_in_window],
                    "a_pause_still_pending_at_window_end": pause_pending,
                    "relay_commands_still_blocked_at_window_end": f"{commands_blocked}/{len(commands)}",
                    "after_sigcont": {
                        "pause_attempts_ended_later": attempts[attempts_in_window:],
                        "relay_commands": [
                            t.result() if t.done() and not t.cancelled() else "pending" for t in commands
                        ],
                        "victim_record": final.state.value,
                    },
                },
            },
            "baseline": {"nothing_hanging": {**baseline, "report_failures": baseline_failures}},
            "delay_p99_hang_minus_baseline_ms": (
                round(figure["delay_p99_ms"] - baseline["delay_p99_ms"], 1)
                if "delay_p99_ms" in figure and "delay_p99_ms" in baseline
                else None
            ),
            "requirement": "NOD-4: the heartbeat delay stays within one report period while a backend hangs",
            "holds": bool(figure.get("within_one_period")),
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each measured window")
    parser.add_argument("--environments", type=int, default=4)
    parser.add_argument("--interval", type=float, default=0.5, help="the node's report_interval_seconds")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.environments, args.interval))
