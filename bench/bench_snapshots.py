"""E2B snapshots on ADX checkpoints through the real ``e2b`` SDK, one run on one ``adx up``.

    uv run python bench/bench_snapshots.py [--rounds 3]

Figures (each round alternates the steps, so drift hits them alike):
- ``snapshot_256mib``: ``create_snapshot()`` of a running sandbox with 256 MiB of random data written in its home
  (incompressible: the capture compresses the sandbox's upper layer, so this is its worst case);
  ``snapshot_empty`` (baseline): the same call on a fresh sandbox (the capture's fixed cost).
- ``create_from_256mib_snapshot_to_first_command``: ``Sandbox.create(snapshot_id)`` then ``commands.run("true")``
  (the restore unpacks the 256 MiB layer); ``create_from_empty_snapshot_to_first_command`` and
  ``plain_create_to_first_command`` (baselines): the same from the empty snapshot, and ``Sandbox.create()``.
Prints one JSON object; progress on stderr.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import emit, progress, summarize
from bench_api import start_cluster, stop_cluster
from e2b import Sandbox

MiB = 1 << 20
WRITTEN_BYTES = 256 * MiB


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {
        "snapshot_256mib": [],
        "snapshot_empty": [],
        "create_from_256mib_snapshot_to_first_command": [],
        "create_from_empty_snapshot_to_first_command": [],
        "plain_create_to_first_command": [],
    }
    with tempfile.TemporaryDirectory(prefix="adx-bench-snapshots-", dir="/tmp") as tmp:
        progress("starting adx up")
        proc, url, key = start_cluster(Path(tmp))
        opts = {"api_url": url, "sandbox_url": url, "api_key": key}

        def first_command(template: str | None) -> None:
            sandbox = Sandbox.create(template, **opts) if template else Sandbox.create(**opts)
            try:
                sandbox.commands.run("true")
            finally:
                sandbox.kill()

        try:
            for round_ in range(args.rounds):
                progress(f"round {round_ + 1}/{args.rounds}")
                full = Sandbox.create(timeout=600, **opts)
                empty = Sandbox.create(timeout=600, **opts)
                try:
                    full.commands.run(f"head -c {WRITTEN_BYTES} /dev/urandom > /home/user/data.bin", timeout=300)
                    seconds, big = timed(full.create_snapshot)
                    samples["snapshot_256mib"].append(seconds)
                    seconds, small = timed(empty.create_snapshot)
                    samples["snapshot_empty"].append(seconds)
                    for name, template in [
                        ("create_from_256mib_snapshot_to_first_command", big.snapshot_id),
                        ("create_from_empty_snapshot_to_first_command", small.snapshot_id),
                        ("plain_create_to_first_command", None),
                    ]:
                        seconds, _ = timed(lambda t=template: first_command(t))  # type: ignore[misc]
                        samples[name].append(seconds)
                    check = Sandbox.create(big.snapshot_id, **opts)
                    try:  # the restored sandbox has the data (the figure is of a real restore)
                        size = check.commands.run("stat -c %s /home/user/data.bin").stdout.strip()
                        assert int(size) == WRITTEN_BYTES, size
                    finally:
                        check.kill()
                    for snapshot in (big, small):
                        Sandbox.delete_snapshot(snapshot.snapshot_id, **opts)
                finally:
                    full.kill()
                    empty.kill()
        finally:
            stop_cluster(proc)
    figures: dict[str, Any] = {name: summarize(values) for name, values in samples.items()}
    plain = figures["plain_create_to_first_command"]["p50_ms"]
    figures["ratios"] = {
        "create_from_256mib_snapshot_vs_plain_create_p50": round(
            figures["create_from_256mib_snapshot_to_first_command"]["p50_ms"] / plain, 2
        ),
        "create_from_empty_snapshot_vs_plain_create_p50": round(
            figures["create_from_empty_snapshot_to_first_command"]["p50_ms"] / plain, 2
        ),
        "snapshot_256mib_vs_empty_p50": round(
            figures["snapshot_256mib"]["p50_ms"] / figures["snapshot_empty"]["p50_ms"], 2
        ),
    }
    emit("snapshots", figures)


if __name__ == "__main__":
    main()
