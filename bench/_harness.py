"""Tiny benchmark harness: timing helpers and the one-JSON-object output every bench script prints.

Every figure is reported beside a baseline measured in the same run, on the same machine, so the numbers
can be compared across machines only as ratios.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("no samples")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize(samples_s: list[float], unit: str = "ms") -> dict[str, float | int]:
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    return {
        f"p50_{unit}": round(percentile(samples_s, 50) * scale, 3),
        f"p99_{unit}": round(percentile(samples_s, 99) * scale, 3),
        f"mean_{unit}": round(statistics.fmean(samples_s) * scale, 3),
        "n": len(samples_s),
    }


def time_calls(fn: Callable[[], object], n: int, warmup: int = 0) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def progress(message: str) -> None:
    """Progress goes to stderr so stdout stays one JSON object."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def emit(name: str, figures: dict[str, Any]) -> None:
    report = {
        "benchmark": name,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()},
        **figures,
    }
    print(json.dumps(report, indent=2))
