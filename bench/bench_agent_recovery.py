"""Time from a worker SIGKILL to its runs continuing under a new owner, with and without worker liveness.

    uv run --group bench python bench/bench_agent_recovery.py [--kills 5] [--lease 30]

Two real ``adx agent worker`` processes on one embedded PostgreSQL: A drives runs of a 10-node graph whose
nodes sleep, B is a live peer. A is SIGKILLed mid-node; measured from the kill (database clock) to the first
node attempt of a higher fence (the reclaim) and to the first checkpoint of a higher fence (the first node
commit by the new owner). Baseline, same run: the same with liveness off (``liveness_grace_seconds = 0``),
where only lease expiry frees the runs (``--lease`` seconds, 30 by default as in production).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from _harness import emit, progress, summarize
from psycopg import sql

from adx.config import PostgresServerConfig
from adx.embedded import EmbeddedPostgres

HERE = Path(__file__).parent
TENANT = "bench"


def start_worker(config: Path, dsn: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env["BENCH_AGENT_DSN"] = dsn
    return subprocess.Popen(
        [sys.executable, "-c", "from adx.cli import main; main()", "agent", "worker", "--config", str(config)],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def wait_for(predicate: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {within}s")
        time.sleep(0.01)


def one_kill(dsn: str, tmp: Path, *, grace: float, lease: float, index: str) -> dict[str, float]:
    config = tmp / f"w{index}.toml"
    config.write_text(
        f'database_url = "{dsn}"\ntenant_id = "{TENANT}"\nregistrations = "bench_agent_app"\nslots = 4\n'
        f"idle_poll_seconds = 0.05\nlease_seconds = {lease}\nliveness_grace_seconds = {grace}\n"
        "max_node_attempts = 100\ndrain_seconds = 2\n"
    )
    log = tmp / f"w{index}.log"
    sys.path.insert(0, str(HERE))
    import bench_agent_app

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(bench_agent_app.DDL)

    def started(n: int) -> bool:
        return log.exists() and log.read_text().count("agent worker started") >= n

    a = start_worker(config, dsn, log)
    wait_for(lambda: started(1), 60, "worker A started")
    run_ids = submit(dsn, 4)
    with psycopg.connect(dsn, autocommit=True) as conn:

        def a_drives() -> bool:
            row = conn.execute(
                "SELECT count(DISTINCT run_id) FROM bench_node_runs WHERE run_id = ANY(%s) AND fence = 1", (run_ids,)
            ).fetchone()
            return row is not None and row[0] == len(run_ids)

        wait_for(a_drives, 60, "A drives every run")
        b = start_worker(config, dsn, log)
        wait_for(lambda: started(2), 60, "worker B started")
        time.sleep(0.3)  # mid-node: nodes sleep 1 s
        a.send_signal(signal.SIGKILL)
        killed_row = conn.execute("SELECT clock_timestamp()").fetchone()
        a.wait()
        assert killed_row is not None
        killed = killed_row[0]

        def continued() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM adx_agent_checkpoints WHERE run_id = ANY(%s) AND fence >= 2", (run_ids,)
            ).fetchone()
            return row is not None and row[0] > 0

        wait_for(continued, lease * 3 + 30, "a run continued")
        row = conn.execute(
            "SELECT (SELECT min(started_at) FROM adx_agent_attempts WHERE run_id = ANY(%(r)s) AND kind = 'node'"
            "   AND fence >= 2) AS reclaimed,"
            " (SELECT min(created_at) FROM adx_agent_checkpoints WHERE run_id = ANY(%(r)s)"
            "   AND fence >= 2) AS committed",
            {"r": run_ids},
        ).fetchone()
        assert row is not None
        b.send_signal(signal.SIGKILL)
        b.wait()
        # Leave nothing running for the next round.
        conn.execute("UPDATE adx_agent_runs SET status = 'cancelled', lease_owner = NULL, lease_expires_at = NULL")
    return {
        "kill_to_reclaim_s": (row[0] - killed).total_seconds(),
        "kill_to_first_commit_s": (row[1] - killed).total_seconds(),
    }


def submit(dsn: str, count: int) -> list[uuid.UUID]:
    import asyncio

    from adx.agents import AgentRuns, AgentStore
    from adx.agents._deploy import build_executables, load_registrations

    async def go() -> list[uuid.UUID]:
        store = await AgentStore.open(dsn, migrate=False)
        try:
            runs = AgentRuns(store, build_executables(load_registrations("bench_agent_app")))
            return [(await runs.submit(TENANT, "slow", "1", {"sleep_ms": 1000})).run_id for _ in range(count)]
        finally:
            await store.close()

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--lease", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        server = EmbeddedPostgres(tmp / "pg", PostgresServerConfig())
        info = server.start()
        try:
            admin = info.url.rsplit("/", 1)[0] + "/postgres"
            figures: dict[str, Any] = {"lease_seconds": args.lease}
            for mode, grace, kills in (("liveness", 1.0, args.kills), ("lease_only_baseline", 0.0, 1)):
                samples: list[dict[str, float]] = []
                for i in range(kills):
                    name = f"b_{uuid.uuid4().hex[:8]}"
                    with psycopg.connect(admin, autocommit=True) as conn:
                        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                    dsn = info.url.rsplit("/", 1)[0] + f"/{name}"
                    samples.append(one_kill(dsn, tmp, grace=grace, lease=args.lease, index=f"{mode}{i}"))
                    progress(f"{mode} kill {i + 1}/{kills}: {samples[-1]}")
                figures[mode] = {
                    "liveness_grace_seconds": grace or None,
                    "kill_to_reclaim": summarize([s["kill_to_reclaim_s"] for s in samples], "s"),
                    "kill_to_first_commit": summarize([s["kill_to_first_commit_s"] for s in samples], "s"),
                }
            emit("agent_recovery", figures)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
