"""Pause, resume and wake on traffic on a real ``adx up`` cluster, each figure beside a baseline of the same run.

    uv run python bench/bench_lifecycle.py [--rounds 10] [--mib 64] [--disk-quota auto|off|both]

Every round creates an Environment (cpu 1, 512Mi), writes ``--mib`` MiB of random data to $HOME with ``dd``
through a command, and then (issue 6 targets in brackets):
- ``pause_64mib``: ``env.pause()`` from the call to its return (freeze, capture, publish, commit Paused,
  release) [<= 1.5 s];
- ``resume_to_first_command``: ``env.resume()`` then ``commands.run("true")`` until its result [<= 400 ms];
- a second pause (``pause_64mib_after_resume``, for attribution), then
- ``wake_on_traffic_first_byte``: ``commands.run("true")`` on the paused Environment until the response
  starts (the Ingress resumes it through EnsureRunning, then forwards) [<= 600 ms], and
  ``wake_on_traffic_to_result`` until the command's result.
Baseline: ``create_to_first_command`` (SDK ``create(wait=True)`` then ``commands.run("true")``) in the same
rounds. ``--disk-quota`` is adx up's (``auto``, its default: a btrfs pool, pauses are snapshots; ``off``: the
tar copy); ``both`` runs the rounds on an ``auto`` cluster and then on an ``off`` one, the second the baseline
of the first. Each Environment asks for ``--mib`` x 2 (at least 1 GiB) of disk. Prints one JSON object;
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import emit, progress, summarize
from bench_api import start_cluster, stop_cluster, wait_deleted

import adx

CPU = 1
MEMORY = "512Mi"
TARGETS_MS = {
    "pause_64mib": 1500,
    "resume_to_first_command": 400,
    "wake_on_traffic_first_byte": 600,
}


def one_round(client: adx.Client, mib: int, samples: dict[str, list[float]], sizes: list[int]) -> None:
    start = time.perf_counter()
    env = client.environments.create(cpu=CPU, memory=MEMORY, disk=f"{max(2 * mib, 1024)}Mi")
    assert env.commands.run("true").exit_code == 0
    samples["create_to_first_command"].append(time.perf_counter() - start)
    try:
        written = env.commands.run(f"dd if=/dev/urandom of=$HOME/blob bs=1M count={mib} 2>&1 && sync")
        assert written.exit_code == 0, written

        start = time.perf_counter()
        env.pause()
        samples["pause_64mib"].append(time.perf_counter() - start)
        assert env.state == "paused" and env.checkpoint is not None, env
        sizes.append(env.checkpoint.size_bytes)

        start = time.perf_counter()
        env.resume()
        assert env.commands.run("true").exit_code == 0
        samples["resume_to_first_command"].append(time.perf_counter() - start)

        start = time.perf_counter()
        env.pause()
        samples["pause_64mib_after_resume"].append(time.perf_counter() - start)

        start = time.perf_counter()
        with env.commands.stream("true") as running:
            samples["wake_on_traffic_first_byte"].append(time.perf_counter() - start)
            result = running.result
        samples["wake_on_traffic_to_result"].append(time.perf_counter() - start)
        assert result.exit_code == 0, result
        size = env.commands.run("stat -c %s $HOME/blob").stdout.strip()
        assert size == str(mib * 2**20), f"the blob did not survive two pauses: {size}"
    finally:
        env.delete()
        wait_deleted(env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--mib", type=int, default=64, help="MiB written before each pause")
    parser.add_argument("--disk-quota", choices=("auto", "off", "both"), default="auto", help="adx up's disk_quota")
    args = parser.parse_args()
    modes = ["auto", "off"] if args.disk_quota == "both" else [args.disk_quota]
    results = {mode: run_cluster(mode, args.rounds, args.mib) for mode in modes}
    if len(results) == 1:
        emit("lifecycle", results[modes[0]])
    else:
        emit("lifecycle", {"disk_quota_auto": results["auto"], "baseline_disk_quota_off": results["off"]})


def run_cluster(disk_quota: str, rounds: int, mib: int) -> dict[str, Any]:
    names = [
        "create_to_first_command",
        "pause_64mib",
        "resume_to_first_command",
        "pause_64mib_after_resume",
        "wake_on_traffic_first_byte",
        "wake_on_traffic_to_result",
    ]
    samples: dict[str, list[float]] = {name: [] for name in names}
    sizes: list[int] = []  # the published checkpoints' sizes (what a pause captured)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="adx-bench-lifecycle-", dir="/var/tmp") as tmp:
        progress(f"starting adx up (disk_quota {disk_quota})")
        proc, url, key = start_cluster(Path(tmp), f'disk_quota = "{disk_quota}"\n')
        try:
            with adx.Client(api_url=url, api_key=key) as client:
                progress("warm-up round")
                one_round(client, mib, {name: [] for name in names}, [])
                for i in range(rounds):
                    progress(f"round {i + 1}/{rounds}")
                    one_round(client, mib, samples, sizes)
        finally:
            stop_cluster(proc)
    figures: dict[str, Any] = {name: summarize(values) for name, values in samples.items()}
    baseline = figures["create_to_first_command"]["p50_ms"]
    figures["targets_met"] = {
        f"{name}_{q}_le_{limit}ms": figures[name][f"{q}_ms"] <= limit
        for name, limit in TARGETS_MS.items()
        for q in ("p50", "p99")
    }
    figures["vs_create_to_first_command_p50"] = {
        name: round(figures[name]["p50_ms"] / baseline, 2) for name in names if name != "create_to_first_command"
    }
    figures["environment"] = {
        "cpu": CPU,
        "memory": MEMORY,
        "disk_quota": disk_quota,
        "written_mib": mib,
        "checkpoint_size_bytes_median": sorted(sizes)[len(sizes) // 2],
    }
    figures["load_average"] = {
        "before": [round(x, 2) for x in load_before],
        "after": [round(x, 2) for x in os.getloadavg()],
    }
    return figures


if __name__ == "__main__":
    main()
