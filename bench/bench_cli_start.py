"""How long the ``adx`` CLI takes to start for client commands (issue 17: under 300 ms).

Each case is a fresh ``python -m adx ...`` process, timed wall-clock from spawn to exit, several times; the
baseline is ``python -c pass`` with the same interpreter in the same run (the floor no CLI can beat).
``env list`` talks to a one-route HTTP server on loopback in this process that answers an empty list, so the
figure is the CLI's start plus one local round trip, not the cluster's speed.

    uv run --frozen --no-sync python bench/bench_cli_start.py [--runs 9]

Prints one JSON object: for two set-ups (with and without a bytecode cache, see main()), per case the median
and min wall time and the median CPU time (user + system) in milliseconds, each case's CPU time over the
baseline's, and the machine's load average (a loaded machine inflates wall times; CPU time much less).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _EmptyList(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"environments": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(argv: list[str], env: dict[str, str], runs: int) -> dict[str, float]:
    """Wall time, and the process's CPU time (user + system), which a busy machine disturbs far less."""
    wall, cpu = [], []
    for _ in range(runs):
        cpu_before = _cpu_seconds()
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((_cpu_seconds() - cpu_before) * 1000)
        if done.returncode != 0:
            raise SystemExit(f"{argv} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return {
        "median_ms": round(statistics.median(wall), 1),
        "min_ms": round(min(wall), 1),
        "cpu_median_ms": round(statistics.median(cpu), 1),
    }


def _run_all(cases: dict[str, list[str]], env: dict[str, str], runs: int) -> dict[str, object]:
    for argv in cases.values():
        _time(argv, env, 1)  # warm the page cache (and, where allowed, write the bytecode cache)
    results = {name: _time(argv, env, runs) for name, argv in cases.items()}
    baseline = results["python -c pass (baseline)"]
    return {
        "cases": results,
        "over_baseline_cpu_median_ms": {
            name: round(r["cpu_median_ms"] - baseline["cpu_median_ms"], 1)
            for name, r in results.items()
            if "baseline" not in name
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyList)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ADX_", "PYTHONDONTWRITEBYTECODE"))},
        "ADX_API_URL": f"http://127.0.0.1:{server.server_address[1]}",
        "ADX_API_KEY": "adxk_bench",
        "XDG_CONFIG_HOME": "/nonexistent",
    }
    adx = [sys.executable, "-m", "adx"]
    cases = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "adx --help": [*adx, "--help"],
        "adx env --help": [*adx, "env", "--help"],
        "adx env list": [*adx, "env", "list"],
        "adx env list --json": [*adx, "env", "list", "--json"],
    }
    # Two set-ups: Python's usual one, where the first run writes bytecode (.pyc) that later runs load (here
    # into a private PYTHONPYCACHEPREFIX: nothing is written into the environment or the checkout), and one
    # that compiles every module from source at each start (PYTHONDONTWRITEBYTECODE=1 in an environment
    # installed without .pyc files, as uv installs by default: this project's CI and sandboxes run that way).
    with tempfile.TemporaryDirectory(prefix="adx-bench-pycache-") as cache:
        cached = _run_all(cases, {**env, "PYTHONPYCACHEPREFIX": cache}, args.runs)
    uncached = _run_all(cases, {**env, "PYTHONDONTWRITEBYTECODE": "1"}, args.runs)
    server.shutdown()
    print(
        json.dumps(
            {
                "runs": args.runs,
                "python": sys.version.split()[0],
                "load_average_1m": round(os.getloadavg()[0], 2),
                "with_bytecode_cache": cached,
                "without_bytecode_cache": uncached,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
