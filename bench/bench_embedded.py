"""Embedded servers: start-up time, and a Lua compare-and-set round trip beside a plain SET.

    uv run python bench/bench_embedded.py [--rounds 5] [--ops 2000]

Baselines (same run): exec of the same server binary with ``--version`` (pure process start cost) for the
start-up figures; a plain ``SET`` round trip on the same connection for the Lua CAS figure.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from _harness import emit, progress, summarize, time_calls

from adx.config import RedisServerConfig
from adx.embedded import EmbeddedPostgres, EmbeddedRedis

# The Coordinator's commit shape: write only if the stored revision is the expected one.
CAS_SCRIPT = """
local current = redis.call('HGET', KEYS[1], 'revision')
if (current or '0') ~= ARGV[1] then
  return {0, current or '0'}
end
local next_revision = tostring(tonumber(ARGV[1]) + 1)
redis.call('HSET', KEYS[1], 'revision', next_revision, 'body', ARGV[2])
return {1, next_revision}
"""


def exec_seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True)
    return time.perf_counter() - start


def bench_startup(rounds: int) -> dict[str, object]:
    redis_cold, redis_warm, pg_cold, pg_warm, redis_exec, pg_exec = [], [], [], [], [], []
    for i in range(rounds):
        progress(f"start-up round {i + 1}/{rounds}")
        with tempfile.TemporaryDirectory(prefix="adx-bench-") as tmp:
            state = Path(tmp)
            r = EmbeddedRedis(state)
            start = time.perf_counter()
            r.start()
            redis_cold.append(time.perf_counter() - start)
            r.stop()
            start = time.perf_counter()
            r.start()
            redis_warm.append(time.perf_counter() - start)
            r.stop()

            p = EmbeddedPostgres(state)
            start = time.perf_counter()
            p.start()
            pg_cold.append(time.perf_counter() - start)
            p.stop()
            start = time.perf_counter()
            p.start()
            pg_warm.append(time.perf_counter() - start)
            p.stop()

            redis_exec.append(exec_seconds([str(r.binary), "--version"]))
            pg_exec.append(exec_seconds([str(p.bin_dir / "postgres"), "--version"]))
    return {
        "redis_start_cold": summarize(redis_cold),
        "redis_start_existing_data": summarize(redis_warm),
        "postgres_start_cold_with_initdb": summarize(pg_cold),
        "postgres_start_existing_data": summarize(pg_warm),
        "baseline_redis_server_exec": summarize(redis_exec),
        "baseline_postgres_exec": summarize(pg_exec),
    }


def cas_vs_set(url: str, ops: int) -> dict[str, object]:
    client = redis.Redis.from_url(url)
    cas = client.register_script(CAS_SCRIPT)
    revision = 0

    def cas_once() -> None:
        nonlocal revision
        ok, new = cas(keys=["env:bench"], args=[revision, "x" * 200])
        assert ok == 1, (ok, new)
        revision = int(new)

    set_samples = time_calls(lambda: client.set("plain:bench", "x" * 200), ops, warmup=50)
    cas_samples = time_calls(cas_once, ops)
    cas_summary = summarize(cas_samples, "us")
    set_summary = summarize(set_samples, "us")
    return {
        "lua_cas_round_trip": cas_summary,
        "baseline_plain_set_round_trip": set_summary,
        "ratio_p50_cas_over_set": round(cas_summary["p50_us"] / set_summary["p50_us"], 3),
    }


def bench_cas(ops: int) -> dict[str, object]:
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="adx-bench-") as tmp:
        for fsync in ("always", "everysec"):
            server = EmbeddedRedis(Path(tmp) / fsync, RedisServerConfig(appendfsync=fsync))
            info = server.start()
            try:
                progress(f"Lua CAS vs SET, appendfsync={fsync}, {ops} ops each")
                results[f"appendfsync_{fsync}"] = cas_vs_set(info.url, ops)
            finally:
                server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="start-up rounds (fresh state dir each)")
    parser.add_argument("--ops", type=int, default=2000, help="round trips per Redis figure")
    args = parser.parse_args()
    emit("embedded", {"startup": bench_startup(args.rounds), "redis_commit": bench_cas(args.ops)})


if __name__ == "__main__":
    main()
