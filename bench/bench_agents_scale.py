"""4 worker processes, 10,000 runs of the 10-node graph, beside DBOS on the same PostgreSQL; then SIGKILL to
the first node commit by a new owner.

    uv run --group bench python bench/bench_agents_scale.py [--runs 10000] [--workers 4] [--slots 4] [--kills 5]

One embedded PostgreSQL (fsync on), two databases on it. Figure: ``--workers`` real ``adx agent worker``
processes (``slots`` each) execute ``--runs`` runs of ``noop10`` (ten no-op nodes, each one fenced checkpoint
and validated journal event). A closed-loop submitter keeps ``workers x slots`` runs in flight: end-to-end
latency is from before ``AgentRuns.submit`` until the submitter sees the run succeeded (polled every 5 ms; the
database's own ``finished_at - created_at`` is reported beside it). Baseline, same run: ``--workers`` DBOS
Transact processes on the same server, each keeping ``slots`` workflows of ten no-op steps in flight
(``start_workflow_async`` to ``get_result``), the same total concurrency; the processes start together.

Then, with the workers still up, ``--kills`` samples: runs of ``slow`` (ten nodes of ``--sleep-ms``) are
submitted, the worker owning most of them is SIGKILLed mid-node, and the time from the kill (database clock) to
the first checkpoint of a higher fence on one of its runs is recorded (its live peers reclaim through worker
liveness); a replacement worker is started before the next sample. Load average is reported per phase: the
machine is shared. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from bench_agent_recovery import start_worker, wait_for
from bench_agents import create_database

from adx.agents import AgentRuns, AgentStore
from adx.agents._deploy import build_executables, load_registrations
from adx.config import PostgresServerConfig
from adx.embedded import EmbeddedPostgres

HERE = Path(__file__).parent
TENANT = "bench"
STEPS = 10
POLL_S = 0.005


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Workers:
    """Real ``adx agent worker`` processes sharing one config and log."""

    def __init__(self, dsn: str, tmp: Path, slots: int) -> None:
        self.dsn = dsn
        self.config = tmp / "worker.toml"
        self.config.write_text(
            f'database_url = "{dsn}"\ntenant_id = "{TENANT}"\nregistrations = "bench_agent_app"\nslots = {slots}\n'
            "idle_poll_seconds = 0.05\nmax_node_attempts = 100\ndrain_seconds = 5\n"
        )
        self.log = tmp / "workers.log"
        self.procs: list[subprocess.Popen[bytes]] = []

    def _started(self) -> int:
        return self.log.read_text(errors="replace").count("agent worker started") if self.log.exists() else 0

    def spawn(self, count: int) -> None:
        before = self._started()
        self.procs += [start_worker(self.config, self.dsn, self.log) for _ in range(count)]
        wait_for(lambda: self._started() >= before + count, 120, f"{count} workers started")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def adx_closed_loop(dsn: str, runs: int, window: int) -> dict[str, Any]:
    store = await AgentStore.open(dsn, max_size=8, migrate=False)
    try:
        api = AgentRuns(store, build_executables(load_registrations("bench_agent_app")))
        inflight: dict[uuid.UUID, float] = {}
        client: list[float] = []
        database: list[float] = []
        failed = submitted = 0
        report = 1000

        async def submit() -> None:
            begin = time.perf_counter()
            inflight[(await api.submit(TENANT, "noop10", "1", {"i": 0})).run_id] = begin

        start = time.perf_counter()
        async with store.connection("bench: poll") as conn:
            while len(client) < runs:
                need = min(window - len(inflight), runs - submitted)
                if need > 0:
                    await asyncio.gather(*(submit() for _ in range(need)))
                    submitted += need
                await asyncio.sleep(POLL_S)
                cur = await conn.execute(
                    "SELECT run_id, status, extract(epoch FROM finished_at - created_at)::float8 AS e2e"
                    " FROM adx_agent_runs WHERE tenant_id = %s AND run_id = ANY(%s) AND finished_at IS NOT NULL",
                    (TENANT, list(inflight)),
                )
                now = time.perf_counter()
                for row in await cur.fetchall():
                    client.append(now - inflight.pop(row["run_id"]))
                    database.append(row["e2e"])
                    failed += row["status"] != "succeeded"
                if len(client) >= report:
                    progress(f"ADX: {len(client)}/{runs} done, load {loadavg()}")
                    report += 1000
        elapsed = time.perf_counter() - start
    finally:
        await store.close()
    return {
        "runs": runs,
        "concurrency": window,
        "failed": failed,
        "seconds": round(elapsed, 3),
        "runs_per_s": round(runs / elapsed, 1),
        "node_commits_per_s": round(runs * STEPS / elapsed, 1),
        "e2e_latency": summarize(client),
        "e2e_latency_database_clock": summarize(database),
    }


def dbos_child(url: str, runs: int, slots: int) -> None:
    """One DBOS process: launch, say READY, wait for GO on stdin, run ``runs`` workflows ``slots`` at a time."""
    from dbos import DBOS, DBOSConfig

    @DBOS.step()
    async def noop(i: int) -> int:
        return i + 1

    @DBOS.workflow()
    async def workflow(i: int) -> int:
        for _ in range(STEPS):
            i = await noop(i)
        return i

    config: DBOSConfig = {"name": "adx-bench-scale", "system_database_url": url, "run_admin_server": False}
    DBOS(config=config)
    DBOS.launch()
    latencies: list[float] = []

    async def go() -> tuple[float, float]:
        pending = list(range(runs))

        async def slot() -> None:
            while pending:
                pending.pop()
                begin = time.perf_counter()
                handle = await DBOS.start_workflow_async(workflow, 0)
                assert await handle.get_result() == STEPS
                latencies.append(time.perf_counter() - begin)

        start = time.time()
        await asyncio.gather(*(slot() for _ in range(slots)))
        return start, time.time()

    print("READY", flush=True)
    sys.stdin.readline()
    try:
        start, end = asyncio.run(go())
    finally:
        DBOS.destroy()
    print(json.dumps({"start": start, "end": end, "latencies": latencies}), flush=True)


def bench_dbos(url: str, runs: int, processes: int, slots: int) -> dict[str, Any]:
    shares = [runs // processes + (1 if i < runs % processes else 0) for i in range(processes)]
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--dbos-child", url, "--runs", str(share), "--slots", str(slots)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for share in shares
    ]
    for child in children:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "READY":
            raise RuntimeError("a DBOS process did not launch")
    for child in children:  # all launched: start them together
        assert child.stdin is not None
        child.stdin.write("GO\n")
        child.stdin.flush()
    reports = []
    for child in children:
        out, _ = child.communicate(timeout=3600)
        if child.returncode != 0:
            raise RuntimeError(f"a DBOS process exited with {child.returncode}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    latencies = [x for r in reports for x in r["latencies"]]
    return {
        "runs": runs,
        "processes": processes,
        "concurrency": processes * slots,
        "seconds": round(elapsed, 3),
        "runs_per_s": round(runs / elapsed, 1),
        "steps_per_s": round(runs * STEPS / elapsed, 1),
        "e2e_latency": summarize(latencies),
    }


def submit_slow(dsn: str, count: int, sleep_ms: int) -> list[uuid.UUID]:
    async def go() -> list[uuid.UUID]:
        store = await AgentStore.open(dsn, migrate=False)
        try:
            api = AgentRuns(store, build_executables(load_registrations("bench_agent_app")))
            return [(await api.submit(TENANT, "slow", "1", {"sleep_ms": sleep_ms})).run_id for _ in range(count)]
        finally:
            await store.close()

    return asyncio.run(go())


def one_kill(dsn: str, workers: Workers, count: int, sleep_ms: int) -> dict[str, float]:
    run_ids = submit_slow(dsn, count, sleep_ms)
    with psycopg.connect(dsn, autocommit=True) as conn:

        def owners() -> dict[int, list[uuid.UUID]]:
            rows = conn.execute(
                "SELECT run_id, lease_owner FROM adx_agent_runs WHERE run_id = ANY(%s) AND lease_owner IS NOT NULL",
                (run_ids,),
            ).fetchall()
            by_pid: dict[int, list[uuid.UUID]] = {}
            for run_id, owner in rows:
                by_pid.setdefault(int(owner.split(":")[-2]), []).append(run_id)
            return by_pid

        wait_for(lambda: sum(map(len, owners().values())) == count, 60, "every slow run claimed")
        time.sleep(sleep_ms / 1000 * 1.5)  # past the first node: mid-node, with a checkpoint behind
        by_pid = owners()
        pid = max(by_pid, key=lambda p: len(by_pid[p]))
        victim = next(p for p in workers.procs if p.pid == pid)
        fences = dict(
            conn.execute("SELECT run_id, fence FROM adx_agent_runs WHERE run_id = ANY(%s)", (by_pid[pid],)).fetchall()
        )
        victim.send_signal(signal.SIGKILL)
        killed_row = conn.execute("SELECT clock_timestamp()").fetchone()
        victim.wait()
        workers.procs.remove(victim)
        assert killed_row is not None

        def first_commit() -> Any:
            row = conn.execute(
                "SELECT min(c.created_at) FROM adx_agent_checkpoints c JOIN unnest(%s::uuid[], %s::bigint[])"
                " AS k(run_id, fence) ON c.run_id = k.run_id AND c.fence > k.fence",
                (list(fences), list(fences.values())),
            ).fetchone()
            return row[0] if row else None

        wait_for(lambda: first_commit() is not None, 120, "a new owner committed a node")
        committed = first_commit()
        workers.spawn(1)  # back to full strength for the next sample
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM adx_agent_runs WHERE run_id = ANY(%s) AND status = 'succeeded'", (run_ids,)
                ).fetchone()
                == (count,)
            ),
            120,
            "the slow runs finished",
        )
    return {"kill_to_first_commit_s": (committed - killed_row[0]).total_seconds(), "victim_runs": len(fences)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)  # the worker's default (seed: 4 slots)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--sleep-ms", type=int, default=300)
    parser.add_argument("--no-dbos", action="store_true", help="skip the baseline (diagnostics only)")
    parser.add_argument("--dbos-child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dbos_child:
        dbos_child(args.dbos_child, args.runs, args.slots)
        return
    sys.path.insert(0, str(HERE))
    import bench_agent_app

    load: dict[str, list[float]] = {"before": loadavg()}
    with tempfile.TemporaryDirectory(prefix="adx-bench-scale-") as tmp_dir:
        tmp = Path(tmp_dir)
        server = EmbeddedPostgres(tmp / "pg", PostgresServerConfig())
        info = server.start()
        try:
            suffix = uuid.uuid4().hex[:8]
            adx_url = create_database(info.url, f"adx_{suffix}")
            dbos_url = create_database(info.url, f"dbos_{suffix}")

            async def prepare() -> None:
                store = await AgentStore.open(adx_url, max_size=2)  # migrates once, before the workers race
                await store.ensure_tenant(TENANT)
                await store.close()

            asyncio.run(prepare())
            with psycopg.connect(adx_url, autocommit=True) as conn:
                conn.execute(bench_agent_app.DDL)
            window = args.workers * args.slots
            workers = Workers(adx_url, tmp, args.slots)
            try:
                workers.spawn(args.workers)
                progress(f"ADX: {args.runs} runs x {STEPS} nodes, {args.workers} workers x {args.slots} slots")
                figure = asyncio.run(adx_closed_loop(adx_url, args.runs, window))
                load["after_adx"] = loadavg()
                progress(f"ADX: {figure['runs_per_s']} runs/s; kills: {args.kills}")
                kills = [one_kill(adx_url, workers, window // 2, args.sleep_ms) for _ in range(args.kills)]
                for sample in kills:
                    progress(f"kill: {sample}")
                load["after_kills"] = loadavg()
            finally:
                workers.stop()
            if args.no_dbos:
                emit("agents_scale_diagnostic", {"figure": figure, "kills": kills, "load": load})
                return
            progress(f"DBOS: {args.runs} workflows, {args.workers} processes x {args.slots}")
            baseline = bench_dbos(dbos_url, args.runs, args.workers, args.slots)
            load["after_dbos"] = loadavg()
        finally:
            server.stop()
    emit(
        "agents_scale",
        {
            "figure": {
                "adx_durable_runs": figure,
                "kill_to_first_commit_by_new_owner": {
                    **summarize([k["kill_to_first_commit_s"] for k in kills], "s"),
                    "max_s": round(max(k["kill_to_first_commit_s"] for k in kills), 3),
                    "samples_s": [round(k["kill_to_first_commit_s"], 3) for k in kills],
                    "victim_runs": [k["victim_runs"] for k in kills],
                }
                if kills
                else None,
            },
            "baseline": {"dbos_transact_workflows": baseline},
            "ratio": {
                "runs_per_s": round(figure["runs_per_s"] / baseline["runs_per_s"], 3),
                "e2e_p99": round(figure["e2e_latency"]["p99_ms"] / baseline["e2e_latency"]["p99_ms"], 3),
            },
            "load_average_1_5_15": load,
            "notes": f"same PostgreSQL 16 server (fsync on), same run, {args.workers} processes per side, "
            f"{args.workers * args.slots} runs in flight per side; ADX's submitter is a separate process and "
            "sees completion by polling (5 ms), DBOS runs its workflows in the submitting process; worker "
            "liveness on (1 s grace), lease 30 s",
        },
    )


if __name__ == "__main__":
    main()
