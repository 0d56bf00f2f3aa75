"""SIGKILL real worker processes mid-run, many times; a new worker finishes every run (AGT-17, AGT-16).

Each node of the ``chain`` graph writes its side effect through ``ctx.on_commit`` (one row in
``agent_effects``) and logs every execution on a separate connection (``agent_node_runs``). After many kills
at random points: every run succeeded, every node's effect exists exactly once, and no run is stuck.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import agents_testapp
import httpx
import psycopg
import pytest
from agents_helpers import TENANT

from adx.agents import AgentRuns, AgentStore, ExecutableGraphRegistry

HERE = Path(__file__).parent
RUNS = 24
KILLS = 10


def _start_worker(config: Path, dsn: str, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **extra,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "AGENTS_TEST_DSN": dsn,
    }
    return subprocess.Popen(
        [sys.executable, "-c", "from adx.cli import main; main()", "agent", "worker", "--config", str(config)],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _started(log: Path) -> int:
    return log.read_text().count("agent worker started") if log.exists() else 0


@pytest.mark.slow
@pytest.mark.req("AGT-17", "AGT-16", "AGT-13")
async def test_sigkill_workers_at_random_points_loses_and_duplicates_nothing(
    store: AgentStore, executables: ExecutableGraphRegistry, postgres_dsn: str, tmp_path: Path
) -> None:
    runs = AgentRuns(store, executables)
    submitted = [await runs.submit(TENANT, "chain", "1", {"count": 0, "delay_ms": 200}) for _ in range(RUNS)]
    config = tmp_path / "worker.toml"
    config.write_text(
        f'database_url = "{postgres_dsn}"\n'
        f'tenant_id = "{TENANT}"\n'
        'registrations = "agents_testapp"\n'
        "slots = 4\n"
        "lease_seconds = 1.0\n"
        "idle_poll_seconds = 0.05\n"
        "drain_seconds = 5\n"
        # Kills are not poison: allow many abandoned attempts per step before quarantine.
        "max_node_attempts = 100\n"
    )
    log = tmp_path / "worker.log"
    seed = int(os.environ.get("AGENTS_FAULT_SEED", str(time.time_ns())))
    print(f"AGENTS_FAULT_SEED={seed}")  # shown on failure: rerun the same kill schedule with it
    rng = random.Random(seed)
    kills = 0
    alive: list[subprocess.Popen[bytes]] = []
    # Up to two workers compete at a time (fencing under real contention); each cycle starts one and
    # SIGKILLs a random live one at a random point after it began claiming.
    while kills < KILLS:
        started = _started(log)
        alive.append(_start_worker(config, postgres_dsn, log))
        deadline = time.monotonic() + 20
        while _started(log) == started and time.monotonic() < deadline and alive[-1].poll() is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        await asyncio.sleep(rng.uniform(0.0, 0.9))
        for worker in alive:
            if worker.poll() is not None:
                pytest.fail(f"worker exited early with {worker.returncode}: {log.read_text()[-2000:]}")
        if len(alive) == 2 or rng.random() < 0.5:
            victim = alive.pop(rng.randrange(len(alive)))
            victim.send_signal(signal.SIGKILL)
            await asyncio.to_thread(victim.wait)
            kills += 1
    for worker in alive:
        worker.send_signal(signal.SIGKILL)
        await asyncio.to_thread(worker.wait)

    # A new worker process finishes every run; none is lost or stuck.
    started = _started(log)
    worker = _start_worker(config, postgres_dsn, log)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            views = [await runs.get_run(TENANT, r.run_id) for r in submitted]
            if all(v.finished for v in views):
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail(f"runs not finished: {[(v.run_id, v.status) for v in views if not v.finished]}")
    finally:
        # SIGTERM only once the worker installed its handlers (a signal during imports just kills it).
        deadline = time.monotonic() + 20
        while _started(log) == started and time.monotonic() < deadline and worker.poll() is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        worker.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(worker.wait, 30)
    assert code == 0, log.read_text()[-3000:]

    assert kills >= KILLS
    assert [v.status for v in views] == ["succeeded"] * RUNS
    for run in submitted:
        result = await runs.get_result(TENANT, run.run_id)
        assert result is not None and result.artifact == {"count": 10}
        assert result.usage["node_commits"] == 10
    with psycopg.connect(postgres_dsn) as conn:
        effects = conn.execute("SELECT run_id, node, count(*) FROM agent_effects GROUP BY run_id, node").fetchall()
        executions = conn.execute("SELECT count(*) FROM agent_node_runs").fetchone()
        takeovers = conn.execute("SELECT count(*) FROM adx_agent_runs WHERE fence > 1").fetchone()
    # Exactly one committed side effect per (run, node): a completed node never ran its effect twice.
    assert len(effects) == RUNS * len(agents_testapp.CHAIN_NODES)
    assert {count for _, _, count in effects} == {1}
    # The kills really landed mid-run: some runs were taken over by a higher fence and some node
    # executions were repeated (their uncommitted effects were rolled back with their transaction).
    print(f"kills={kills} takeovers={takeovers} executions={executions}")
    assert takeovers is not None and takeovers[0] > 0
    assert executions is not None and executions[0] > RUNS * 10


@pytest.mark.slow
@pytest.mark.req("AGT-17", "AGT-6", "AGT-14")
async def test_terminal_replay_in_a_new_process_reruns_no_node(
    store: AgentStore, executables: ExecutableGraphRegistry, postgres_dsn: str, tmp_path: Path
) -> None:
    """Runs stopped at the terminal barrier (evidence withheld) are finished by a new worker process from
    their terminal-ready checkpoint: no node executes again."""
    runs = AgentRuns(store, executables)
    submitted = [await runs.submit(TENANT, "chain", "1", {"count": 0}) for _ in range(4)]
    config = tmp_path / "worker.toml"
    config.write_text(
        f'database_url = "{postgres_dsn}"\ntenant_id = "{TENANT}"\nregistrations = "agents_testapp"\n'
        "idle_poll_seconds = 0.05\n"
    )
    log = tmp_path / "worker.log"
    first = _start_worker(config, postgres_dsn, log, AGENTS_TEST_EVIDENCE="fail")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            views = [await runs.get_run(TENANT, r.run_id) for r in submitted]
            if all(v.checkpoint_seq == 10 and not v.leased for v in views):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"runs did not reach the terminal barrier: {log.read_text()[-2000:]}")
    finally:
        first.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.wait)
    assert all(v.status == "queued" for v in views)  # released, never partially finalised

    port = _free_port()
    config.write_text(config.read_text() + f"health_port = {port}\n")
    started = _started(log)
    second = _start_worker(config, postgres_dsn, log)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            views = [await runs.get_run(TENANT, r.run_id) for r in submitted]
            if all(v.finished for v in views):
                break
            await asyncio.sleep(0.05)
    finally:
        deadline = time.monotonic() + 20
        while _started(log) == started and time.monotonic() < deadline and second.poll() is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        # AGT-14: the health endpoint serves local state and counters, never request content.
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert response.status_code == 200, response.text
        health = response.json()
        assert health["state"] == "running" and health["executed"] == {"succeeded": 4}
        assert set(health) >= {"slots", "busy_slots", "ticks", "readiness_failures", "identity"}
        assert "count" not in response.text
        second.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(second.wait, 30) == 0
    assert [v.status for v in views] == ["succeeded"] * 4
    with psycopg.connect(postgres_dsn) as conn:
        executions = conn.execute("SELECT run_id, count(*) FROM agent_node_runs GROUP BY run_id").fetchall()
    assert sorted(n for _, n in executions) == [10, 10, 10, 10]
