"""InspectNode's own serialisation cost per call (issue 16): N records of one node into the reply's wire form.

    uv run python bench/bench_inspect_wire.py [--records 200] [--calls 300]

Figure: the Coordinator's cache answering the catalog in wire form (each record serialised once per committed
version), then the reply serialised as gRPC sends it; also the call after 1 record of N was committed.
Baseline (same run, same records): every record serialised on every call (what InspectNode did before).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from _harness import emit, summarize, time_calls

from adx.coordinator._cache import CoordinatorCache
from adx.model import EnvironmentRecord, EnvironmentSpec, EnvironmentState, Resources, new_id
from adx.proto import coordinator_pb2 as pb


def records(count: int) -> list[EnvironmentRecord]:
    now = time.time()
    spec = EnvironmentSpec(resources=Resources(cpu_millis=100, memory_bytes=2**27))
    return [
        EnvironmentRecord(
            id=new_id("env"),
            tenant="bench",
            spec=spec,
            state=EnvironmentState.RUNNING,
            node="n1",
            generation=1,
            revision=3,
            execution_id=new_id("exe"),
            created_at=now,
            updated_at=now,
        )
        for _ in range(count)
    ]


def timed(fn: Callable[[], object], calls: int) -> tuple[list[float], float]:
    """Wall time of each call, and the process CPU time per call (which the machine's load does not inflate)."""
    cpu = time.process_time()
    samples = time_calls(fn, calls, warmup=10)
    return samples, round((time.process_time() - cpu) * 1000 / (calls + 10), 3)


def main(count: int, calls: int) -> None:
    cache = CoordinatorCache()
    for record in records(count):
        cache.apply(record)

    def every_record_every_call() -> bytes:
        wire = [record.model_dump_json(by_alias=True) for record in cache.node_catalog("n1")]
        return pb.InspectNodeResponse(environment_json=wire).SerializeToString()

    def from_the_cache() -> bytes:
        return pb.InspectNodeResponse(environment_json=cache.node_catalog_wire("n1")).SerializeToString()

    def one_commit_then_the_cache() -> bytes:
        first = cache.node_catalog("n1")[0]
        cache.apply(first.model_copy(update={"revision": first.revision + 1}))
        return from_the_cache()

    assert every_record_every_call() == from_the_cache()
    baseline, baseline_cpu = timed(every_record_every_call, calls)
    cached, cached_cpu = timed(from_the_cache, calls)
    one_changed, one_changed_cpu = timed(one_commit_then_the_cache, calls)
    figure, base = summarize(cached), summarize(baseline)
    emit(
        "inspect_wire",
        {
            "records_on_node": count,
            "figure": {
                "wire_forms_from_cache": figure | {"cpu_ms_per_call": cached_cpu},
                "after_one_commit": summarize(one_changed) | {"cpu_ms_per_call": one_changed_cpu},
            },
            "baseline": {"every_record_serialised_every_call": base | {"cpu_ms_per_call": baseline_cpu}},
            "ratio_p50_figure_over_baseline": round(figure["p50_ms"] / base["p50_ms"], 3),
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    main(args.records, args.calls)
