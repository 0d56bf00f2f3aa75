"""What worker liveness (fast recovery of a dead worker's runs) costs a healthy worker, same run.

    uv run --group bench python bench/bench_agent_liveness.py [--runs 300] [--slots 8] [--rounds 3]

Figure: ADX runs/s and node-commit p50 of the 10-node no-op graph (bench_agents.bench_adx) with liveness on
(a liveness session and a heartbeat every 0.25 s). Baseline: the same with liveness off
(``liveness_grace_seconds=None``). The OWNER_DEAD test in the scan/claim SQL is present in both (it is static
SQL); its cost shows only against the build before it. Rounds alternate on one PostgreSQL server, each on a
fresh database; medians are reported (on a shared 2-core VM the round-to-round spread exceeds the effect).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

from _harness import emit, progress
from bench_agents import bench_adx, create_database

from adx.config import PostgresServerConfig
from adx.embedded import EmbeddedPostgres


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, list[dict[str, Any]]] = {"liveness_on": [], "liveness_off": []}
    with tempfile.TemporaryDirectory(prefix="adx-bench-liveness-") as tmp:
        server = EmbeddedPostgres(Path(tmp), PostgresServerConfig())
        info = server.start()
        try:
            for i in range(args.rounds):
                for mode, grace in (("liveness_on", 1.0), ("liveness_off", None)):
                    url = create_database(info.url, f"l_{uuid.uuid4().hex[:8]}")
                    figure = asyncio.run(bench_adx(url, args.runs, args.slots, liveness_grace=grace))
                    results[mode].append(figure)
                    progress(f"round {i + 1} {mode}: {figure['runs_per_s']} runs/s")
        finally:
            server.stop()

    def summary(mode: str) -> dict[str, Any]:
        rows = results[mode]
        return {
            "runs_per_s_median": statistics.median(r["runs_per_s"] for r in rows),
            "runs_per_s_all": [r["runs_per_s"] for r in rows],
            "node_commit_p50_ms_median": statistics.median(r["node_commit_latency"]["p50_ms"] for r in rows),
        }

    on, off = summary("liveness_on"), summary("liveness_off")
    emit(
        "agent_liveness_overhead",
        {
            "figure": on,
            "baseline": off,
            "ratio": {"runs_per_s": round(on["runs_per_s_median"] / off["runs_per_s_median"], 3)},
            "runs": args.runs,
            "slots": args.slots,
        },
    )


if __name__ == "__main__":
    main()
