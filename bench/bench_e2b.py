"""``commands.run("true")`` through the real ``e2b`` SDK beside the same call through the ADX SDK, one run.

    uv run python bench/bench_e2b.py [--runs 300] [--rounds 10]

Both SDKs drive the same Environment on the same ``adx up``, in alternating rounds (drift hits both alike).
Figures:
- ``e2b_sdk_run_true``: ``Sandbox.commands.run("true")`` -> envd Connect stream -> adx.e2b -> Ingress -> Relay ->
  execd. The SDK always runs ``/bin/bash -l -c <cmd>``.
- ``adx_sdk_run_true`` (baseline): ``env.commands.run("true")`` (``/bin/sh -c true``) on ``/v1``.
- ``adx_sdk_run_bash_login_true`` (baseline): the ADX SDK running the very argv the E2B SDK sends, so the
  ratio to it is the protocol's cost alone.
- ``e2b_create`` / ``adx_create``: ``Sandbox.create()`` and ``environments.create()`` until usable;
  ``adx_create_egress`` (baseline): ``environments.create(network={"mode": "egress"})``, what an E2B sandbox
  is by default (internet on: a veth pair and its nftables policy), so ``e2b_create`` compares to it like
  for like.
Target (issue 8): the E2B path within 1.5x of the ADX SDK's. Prints one JSON object; progress on stderr.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import emit, progress, summarize, time_calls
from bench_api import start_cluster, stop_cluster
from e2b import Sandbox

import adx

TARGET_RATIO = 1.5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300, help="calls per SDK, split over --rounds")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--creates", type=int, default=5)
    args = parser.parse_args()
    per_round = max(1, args.runs // args.rounds)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="adx-bench-e2b-", dir="/tmp") as tmp:
        progress("starting adx up")
        proc, url, key = start_cluster(Path(tmp))
        opts = {"api_url": url, "sandbox_url": url, "api_key": key}
        try:
            with adx.Client(api_url=url, api_key=key) as client:
                progress(f"create x{args.creates} each")
                e2b_create: list[float] = []
                adx_create: list[float] = []
                egress_create: list[float] = []
                for _ in range(args.creates):
                    start = time.perf_counter()
                    made = Sandbox.create(**opts)
                    e2b_create.append(time.perf_counter() - start)
                    made.kill()
                    start = time.perf_counter()
                    env = client.environments.create(cpu=0.5, memory="512Mi")
                    adx_create.append(time.perf_counter() - start)
                    env.delete()
                    start = time.perf_counter()
                    env = client.environments.create(cpu=0.5, memory="512Mi", network={"mode": "egress"})
                    egress_create.append(time.perf_counter() - start)
                    env.delete()

                sandbox = Sandbox.create(**opts)
                env = client.environments.get(sandbox.sandbox_id)  # the very same Environment
                e2b_samples: list[float] = []
                adx_samples: list[float] = []
                bash_samples: list[float] = []
                progress(f"commands.run('true') x{per_round * args.rounds} per SDK, {args.rounds} rounds")
                for round_ in range(args.rounds):
                    warmup = 5 if round_ == 0 else 0
                    e2b_samples += time_calls(lambda: sandbox.commands.run("true"), per_round, warmup)
                    adx_samples += time_calls(lambda: env.commands.run("true"), per_round, warmup)
                    bash_samples += time_calls(
                        lambda: env.commands.run(["/bin/bash", "-l", "-c", "true"]), per_round, warmup
                    )
                sandbox.kill()
        finally:
            stop_cluster(proc)
    figures["e2b_sdk_run_true"] = summarize(e2b_samples)
    figures["adx_sdk_run_true"] = summarize(adx_samples)
    figures["adx_sdk_run_bash_login_true"] = summarize(bash_samples)
    figures["e2b_create"] = summarize(e2b_create)
    figures["adx_create"] = summarize(adx_create)
    figures["adx_create_egress"] = summarize(egress_create)
    ratio = figures["e2b_sdk_run_true"]["p50_ms"] / figures["adx_sdk_run_true"]["p50_ms"]
    same_argv = figures["e2b_sdk_run_true"]["p50_ms"] / figures["adx_sdk_run_bash_login_true"]["p50_ms"]
    figures["targets"] = {
        "e2b_vs_adx_p50_ratio": round(ratio, 2),
        "e2b_vs_adx_same_argv_p50_ratio": round(same_argv, 2),
        f"e2b_within_{TARGET_RATIO}x": ratio <= TARGET_RATIO,
    }
    emit("e2b", figures)


if __name__ == "__main__":
    main()
