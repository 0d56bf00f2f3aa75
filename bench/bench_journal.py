"""The degradation journal (issue 12): append latency and replay throughput, each beside a baseline of the same run.

    uv run --frozen --no-sync python bench/bench_journal.py [--n 1000] [--environments 100]

- ``append``: ``--n`` calls of ``DegradationJournal.append`` (a real SQLite file on the real disk, WAL,
  ``synchronous=FULL``, one fsynced transaction per result; the call runs in a worker thread and reads the
  stored row back). Baseline, interleaved call by call on another file in the same directory: a plain SQLite
  insert of the same row (same table, same values) with the same pragmas and one transaction per insert, on
  the calling thread (``plain_insert``) and through ``asyncio.to_thread`` (``plain_insert_to_thread``, for
  attribution); and, as a reference for the disk itself, a 4 KiB ``pwrite`` + ``fdatasync`` on a third file.
  The first append, which creates the file (schema at a temporary name, fsync, rename), is
  reported on its own and left out of the percentiles.
- ``replay``: a real Coordinator (in-process gRPC server with mutual TLS, as ``tests/conftest.py`` starts it)
  on a real Redis, one registered node session (node certificate), ``2 x --environments`` Pending records the
  node owns (stored before the Coordinator starts; it loads them; the node address is one nobody listens on).
  The ``--n`` appended results above are ``--n / --environments`` valid transitions per Environment
  (pending -> starting -> running -> starting (restart) -> running ...), each on the previous revision; they
  are replayed as a Controller does (``journal.pending(env_id)`` then ``replay()``, one Environment after
  another, sequentially). Baseline (same run, same Coordinator, the other ``--environments`` records): the
  same number of commits with the same changes sent straight through ``CoordinatorSink.commit_wire``, no
  journal. The two are interleaved Environment by Environment (alternating which goes first) so that the
  load of a shared machine weighs on both alike; each total is the sum of its per-Environment times.

Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from _harness import emit, percentile, progress, summarize

from adx._certs import Identity, init_ca, issue
from adx._grpc_tls import channel_credentials
from adx.config import CoordinatorConfig
from adx.coordinator import CoordinatorStore
from adx.coordinator._daemon import start_coordinator
from adx.embedded import EmbeddedRedis
from adx.model import EnvironmentRecord, EnvironmentSpec, EnvironmentState, Resources, new_id
from adx.node._coordinator_client import CoordinatorSink
from adx.node._journal import _SCHEMA, DegradationJournal, NewResult, spec_digest
from adx.node._replay import ReplayEnd, replay
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc

S = EnvironmentState
NODE = "n1"
NOWHERE = "127.0.0.1:9"  # the node address the Coordinator is told: nobody listens there


def filesystem_of(path: Path) -> str:
    """The mount (device and type) holding ``path``, to show the journal is on the real disk."""
    best = ("?", "?", "")
    target = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        device, mount, kind = line.split()[:3]
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[2]):
            best = (device, kind, mount)
    return f"{best[0]} ({best[1]}) on {best[2]}"


def chain(env_id: str, spec: EnvironmentSpec, length: int) -> list[NewResult]:
    """``length`` valid transitions from Pending at revision 1, each based on the previous result."""
    digest = spec_digest(spec)
    results = []
    state, execution, revision = S.PENDING, None, 1
    for _ in range(length):
        if state in (S.PENDING, S.RUNNING):
            target, new_execution = S.STARTING, new_id("exe")  # a start, or a restart (new execution)
            changes: dict[str, Any] = {"state": target.value, "executionId": new_execution}
        else:
            target, new_execution = S.RUNNING, execution
            changes = {"state": target.value}
        results.append(
            NewResult(
                env_id=env_id,
                generation=1,
                base_revision=revision,
                base_state=state,
                base_execution_id=execution,
                state=target,
                execution_id=new_execution,
                changes=changes,
                release_reservation=False,
                spec_digest=digest,
            )
        )
        state, execution, revision = target, new_execution, revision + 1
    return results


class PlainTable:
    """The baseline: a plain SQLite table of the journal's schema, WAL + synchronous=FULL, one transaction
    per insert, no read-back, no worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(_SCHEMA)

    def insert(self, result: NewResult, revision_offset: int) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute(
            "INSERT INTO pending_results (env_id, generation, base_revision, revision, base_state,"
            " base_execution_id, state, execution_id, changes, release_reservation, spec_digest, recorded_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                result.env_id,
                result.generation,
                result.base_revision,
                result.revision + revision_offset,  # the two baselines share the table: keep rows unique
                result.base_state.value,
                result.base_execution_id,
                result.state.value,
                result.execution_id,
                json.dumps(result.changes, sort_keys=True),
                int(result.release_reservation),
                result.spec_digest,
                time.time(),
            ),
        )
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


async def append_figures(journal: DegradationJournal, plain: PlainTable, results: list[NewResult]) -> dict[str, Any]:
    progress(f"{len(results)} journal appends, interleaved with {2 * len(results)} plain inserts")
    start = time.perf_counter()
    await journal.append(results[0])  # creates the file
    first = time.perf_counter() - start
    plain.insert(results[0], 0)
    await asyncio.to_thread(plain.insert, results[0], 1_000_000)
    samples: dict[str, list[float]] = {"journal": [], "plain": [], "plain_to_thread": [], "fdatasync": []}
    disk_probe = os.open(plain.path.with_name("fdatasync.probe"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    page = os.urandom(4096)
    for result in results[1:]:
        start = time.perf_counter()
        await journal.append(result)
        samples["journal"].append(time.perf_counter() - start)
        start = time.perf_counter()
        plain.insert(result, 0)
        samples["plain"].append(time.perf_counter() - start)
        start = time.perf_counter()
        await asyncio.to_thread(plain.insert, result, 1_000_000)
        samples["plain_to_thread"].append(time.perf_counter() - start)
        start = time.perf_counter()
        os.pwrite(disk_probe, page, 0)
        os.fdatasync(disk_probe)
        samples["fdatasync"].append(time.perf_counter() - start)
    os.close(disk_probe)
    journal_summary = with_p95(samples["journal"])
    plain_summary = with_p95(samples["plain"])
    return {
        "figure": {"journal_append": journal_summary},
        "baseline": {
            "plain_insert": plain_summary,
            "plain_insert_to_thread": with_p95(samples["plain_to_thread"]),
        },
        "disk_reference_4kib_pwrite_fdatasync": with_p95(samples["fdatasync"]),
        "first_append_creates_file_ms": round(first * 1e3, 3),
        "ratio_p50_journal_over_plain": round(journal_summary["p50_ms"] / plain_summary["p50_ms"], 3),
        "ratio_p99_journal_over_plain": round(journal_summary["p99_ms"] / plain_summary["p99_ms"], 3),
    }


def with_p95(samples: list[float]) -> dict[str, float | int]:
    summary = summarize(samples)
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50_ms": summary["p50_ms"], "p95_ms": round(p95 * 1e3, 3), **summary}


async def main(n: int, environments: int) -> None:
    per_env = max(1, n // environments)
    n = per_env * environments
    with tempfile.TemporaryDirectory(prefix="adx-bench-journal-", dir="/var/tmp") as tmp:
        base = Path(tmp)
        redis_server = EmbeddedRedis(base / "redis")
        info = redis_server.start()
        coordinator = None
        channel = None
        store = None
        try:
            certs = base / "certs"
            init_ca(certs)
            issue(certs, Identity("coordinator", "main"))
            store = CoordinatorStore.from_url(info.url)
            session = new_id("ses")
            await store.register_node(NODE, session=session, address=NOWHERE, session_ttl=600)
            await store.report_capacity(NODE, session, Resources(cpu_millis=10**9, memory_bytes=10**15), valid_for=600)
            progress(f"storing {2 * environments} Pending environments owned by {NODE}")
            spec = EnvironmentSpec(resources=Resources(cpu_millis=100, memory_bytes=2**27))
            ids = []
            for _ in range(2 * environments + 1):
                now = time.time()
                record = EnvironmentRecord(
                    id=new_id("env"),
                    tenant="acme",
                    spec=spec,
                    state=S.PENDING,
                    node=NODE,
                    generation=1,
                    revision=1,
                    created_at=now,
                    updated_at=now,
                )
                ids.append((await store.create_environment(record)).record.id)
            warm_id, journal_ids, direct_ids = ids[0], ids[1 : environments + 1], ids[environments + 1 :]
            coordinator = await start_coordinator(
                CoordinatorConfig(listen="127.0.0.1:0", redis_url=info.url, certs_dir=certs, session_ttl_seconds=600)
            )
            channel = grpc.aio.secure_channel(
                f"localhost:{coordinator.port}", channel_credentials(issue(certs, Identity("node", NODE)))
            )
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            await stub.RegisterNode(pb.RegisterNodeRequest(node=NODE, session=session, address=NOWHERE))
            sink = CoordinatorSink(stub, NODE, lambda: session, rpc_timeout=10.0)

            # Append: the journal results of the replay below, interleaved with the plain-insert baselines.
            journal_path = base / "journal" / "degradation.sqlite"
            journal = DegradationJournal(journal_path)
            plain = PlainTable(base / "plain.sqlite")
            results = [r for env_id in journal_ids for r in chain(env_id, spec, per_env)]
            # Round-robin over the Environments (as results of concurrent Controllers would arrive).
            results.sort(key=lambda r: (r.base_revision, journal_ids.index(r.env_id)))
            appended = await append_figures(journal, plain, results)
            plain.close()
            assert len(await journal.pending()) == n

            # Warm the commit path (channel, scripts, caches) on an Environment neither side uses.
            for result in chain(warm_id, spec, 10):
                await sink.commit_wire(warm_id, result.base_revision, 1, result.changes)

            progress(f"replay of {n} journaled results beside {n} direct commits, Environment by Environment")
            # Interleaved (one Environment replayed, one committed directly, the order alternating), so that
            # the load of the machine weighs on both sides alike; the totals are the sums of these times.
            direct_chains = {env_id: chain(env_id, spec, per_env) for env_id in direct_ids}
            direct_per_env: list[float] = []
            replay_per_env: list[float] = []
            committed = 0

            async def direct(env_id: str) -> None:
                start = time.perf_counter()
                for result in direct_chains[env_id]:
                    await sink.commit_wire(env_id, result.base_revision, result.generation, result.changes)
                direct_per_env.append(time.perf_counter() - start)

            async def replayed(env_id: str) -> None:
                nonlocal committed
                start = time.perf_counter()
                entries = await journal.pending(env_id)
                outcome = await replay(journal, sink, NODE, entries, sink.fetch)
                replay_per_env.append(time.perf_counter() - start)
                if outcome.end is not ReplayEnd.DONE or outcome.remaining:
                    raise RuntimeError(f"replay of {env_id} ended {outcome}")
                committed += outcome.committed

            wall_start = time.perf_counter()
            for index, (journal_id, direct_id) in enumerate(zip(journal_ids, direct_ids, strict=True)):
                if index % 2:
                    await direct(direct_id)
                    await replayed(journal_id)
                else:
                    await replayed(journal_id)
                    await direct(direct_id)
            wall = time.perf_counter() - wall_start
            replay_total, direct_total = sum(replay_per_env), sum(direct_per_env)
            journal.close()
            if journal_path.exists():
                raise RuntimeError("the journal file is still there after replaying everything")
            final = {record.id: record for record in await sink.catalog()}
            expected_revision = 1 + per_env
            for env_id in journal_ids + direct_ids:
                if final[env_id].revision != expected_revision:
                    raise RuntimeError(f"{env_id} at revision {final[env_id].revision}, expected {expected_revision}")
        finally:
            if channel is not None:
                await channel.close(None)
            if coordinator is not None:
                await coordinator.stop(grace=None)
            if store is not None:
                with contextlib.suppress(Exception):
                    await store.close()
            redis_server.stop()
        disk = filesystem_of(base)
    replay_rate = committed / replay_total
    direct_rate = n / direct_total
    emit(
        "journal",
        {
            "journal_dir": f"{tmp} [{disk}]",
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
            "append": {"n": n, **appended},
            "replay": {
                "entries": committed,
                "environments": environments,
                "entries_per_environment": per_env,
                "figure": {
                    "journal_replay_total_s": round(replay_total, 3),
                    "entries_per_s": round(replay_rate, 1),
                    "per_environment_pending_plus_replay": summarize(replay_per_env),
                },
                "baseline": {
                    "direct_commit_wire_total_s": round(direct_total, 3),
                    "entries_per_s": round(direct_rate, 1),
                    "per_environment_commits": summarize(direct_per_env),
                },
                "ratio_replay_time_over_direct": round(replay_total / direct_total, 3),
                "ratio_p50_per_environment": round(percentile(replay_per_env, 50) / percentile(direct_per_env, 50), 3),
                "wall_clock_both_s": round(wall, 3),
                "file_removed_after_last_entry": True,
            },
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="journaled results (appends and replayed entries)")
    parser.add_argument("--environments", type=int, default=100, help="Environments the results are spread over")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.environments))
