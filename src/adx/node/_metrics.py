"""Instance metrics (MET-1..4): periodic usage samples of running executions, kept apart from lifecycle state.

The sampler reads the RuntimeDriver's Stats every ``metrics_interval_seconds`` for running executions only,
outside the Controllers' queues, with at most 32 Stats calls in flight (lifecycle operations never wait for a
sampling slot). A sample is written to the cache only if, at the moment of writing, the same Controller still
owns the Environment with the same execution and generation and is running: a sample that arrives after a
pause, an exit or a replacement is dropped, and a failed sample changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from adx.errors import AdxError, ConflictError, EnvironmentPausedError
from adx.model import DORMANT_STATES, EnvironmentState, EnvironmentStats, Resources, admission_limit, allocatable
from adx.node._controller import Controller
from adx.runtime import ExecutionStats, RuntimeDriver

log = logging.getLogger("adx.node.metrics")
S = EnvironmentState

#: MET-2: Stats calls in flight at once, across all Environments of the node.
MAX_CONCURRENT_STATS = 32
#: The shortest interval a CPU rate is computed over when a request finds a single reading.
FIRST_RATE_WINDOW_SECONDS = 0.2
#: States in which an Environment holds its node reservation (a paused one released it; a failed one holds it
#: only while a restart is pending).
_HOLDING = frozenset(set(EnvironmentState) - {S.PAUSED, S.DELETED, S.FAILED})


@dataclass(frozen=True)
class Sample:
    env_id: str
    tenant: str
    execution_id: str
    generation: int
    stats: ExecutionStats
    taken_at: float  # monotonic: CPU rates are computed over monotonic intervals
    cpu_percent: float | None


def cpu_limit_cores(resources: Resources) -> float:
    return resources.cpu_millis / 1000.0


def _owns(controller: Controller, execution_id: str, generation: int) -> bool:
    execution = controller.execution
    return (
        not controller.closed
        and controller.state is S.RUNNING
        and execution is not None
        and execution.execution_id == execution_id
        and controller.record.generation == generation
    )


class MetricsCache:
    """The last sample per Environment (MET-3)."""

    def __init__(self) -> None:
        self.samples: dict[str, Sample] = {}

    def write(
        self,
        sampled: Controller,
        current: Controller | None,
        execution_id: str,
        generation: int,
        stats: ExecutionStats,
        taken_at: float,
    ) -> Sample | None:
        """Keep the sample if ``sampled`` is still ``current`` with the same running execution and generation.

        Check and write happen without an await between them, so no lifecycle change can slip in."""
        if current is not sampled or not _owns(sampled, execution_id, generation):
            log.debug("late sample dropped", extra={"env_id": sampled.env_id, "execution_id": execution_id})
            return None
        previous = self.samples.get(sampled.env_id)
        cpu_percent = None
        if previous is not None and previous.execution_id == execution_id and taken_at > previous.taken_at:
            cores = cpu_limit_cores(sampled.record.spec.resources) or float(os.cpu_count() or 1)
            used = max(stats.cpu_usage_seconds - previous.stats.cpu_usage_seconds, 0.0)
            cpu_percent = round(100.0 * used / (taken_at - previous.taken_at) / cores, 2)
        sample = Sample(sampled.env_id, sampled.record.tenant, execution_id, generation, stats, taken_at, cpu_percent)
        self.samples[sampled.env_id] = sample
        return sample

    def current(self, controller: Controller) -> Sample | None:
        """The sample of the Controller's running execution, if there is one."""
        sample = self.samples.get(controller.env_id)
        if sample is None or not _owns(controller, sample.execution_id, sample.generation):
            return None
        return sample

    def prune(self, controllers: dict[str, Controller]) -> None:
        """Forget samples whose execution is no longer the running one."""
        for env_id, sample in list(self.samples.items()):
            controller = controllers.get(env_id)
            if controller is None or not _owns(controller, sample.execution_id, sample.generation):
                del self.samples[env_id]


@dataclass(eq=False)
class MetricsSampler:
    """Samples the usage of every running Environment of the node each ``interval`` (MET-1)."""

    driver: RuntimeDriver
    controllers: Callable[[], dict[str, Controller]]
    _: KW_ONLY
    node: str
    interval: float
    call_timeout: float
    cache: MetricsCache = field(default_factory=MetricsCache, init=False)
    _slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_CONCURRENT_STATS), init=False)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sample_round()
            except Exception:
                # A bug in one round must not end sampling for the node's lifetime.
                log.exception("metrics round failed", extra={"node": self.node})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    async def sample_round(self) -> None:
        """MET-1: running executions only; each sample on its own, none waits for a lifecycle queue."""
        controllers = self.controllers()
        self.cache.prune(controllers)
        async with asyncio.TaskGroup() as group:
            for controller in controllers.values():
                if controller.state is S.RUNNING and controller.execution is not None:
                    group.create_task(self._sample_quietly(controller))

    async def _sample_quietly(self, controller: Controller) -> None:
        try:
            await self.sample(controller)
        except AdxError as exc:
            # MET-3: a failed sample changes nothing; the next round tries again.
            log.debug("sample failed: %s", exc, extra={"env_id": controller.env_id})

    async def sample(self, controller: Controller) -> Sample | None:
        execution = controller.execution
        generation = controller.record.generation
        if controller.state is not S.RUNNING or execution is None:
            return None
        async with self._slots:
            try:
                stats = await asyncio.wait_for(self.driver.stats(execution), self.call_timeout)
            except TimeoutError:
                raise ConflictError(f"stats of {controller.env_id} took over {self.call_timeout:g}s") from None
        current = self.controllers().get(controller.env_id)
        return self.cache.write(controller, current, execution.execution_id, generation, stats, time.monotonic())

    async def stats_of(self, controller: Controller) -> EnvironmentStats:
        """The Environment's usage: the cached sample, or one taken now when there is none. Never wakes it."""
        if controller.state is not S.RUNNING or controller.execution is None:
            if controller.state in DORMANT_STATES:
                raise EnvironmentPausedError(
                    f"environment {controller.env_id} is {controller.state.value}: no usage to report",
                    details={"state": controller.state.value},
                )
            raise ConflictError(
                f"environment {controller.env_id} is {controller.state.value}; only a running one has usage",
                details={"state": controller.state.value},
            )
        sample = self.cache.current(controller) or await self.sample(controller)
        if sample is not None and sample.cpu_percent is None:
            # A rate needs two readings: the second one a short window after the first.
            await asyncio.sleep(max(FIRST_RATE_WINDOW_SECONDS - (time.monotonic() - sample.taken_at), 0.0))
            sample = await self.sample(controller) or sample
        if sample is None:
            raise ConflictError(f"environment {controller.env_id} changed while it was sampled; ask again")
        return self.view(controller, sample)

    def view(self, controller: Controller, sample: Sample) -> EnvironmentStats:
        resources = controller.record.spec.resources
        return EnvironmentStats(
            environment_id=sample.env_id,
            execution_id=sample.execution_id,
            generation=sample.generation,
            node=self.node,
            sampled_at=sample.stats.observed_at,
            sample_age_seconds=round(max(time.monotonic() - sample.taken_at, 0.0), 3),
            cpu_limit_cores=cpu_limit_cores(resources),
            cpu_usage_seconds=sample.stats.cpu_usage_seconds,
            cpu_percent=sample.cpu_percent,
            memory_bytes=sample.stats.memory_bytes,
            memory_peak_bytes=sample.stats.memory_peak_bytes,
            memory_cache_bytes=sample.stats.memory_cache_bytes,
            memory_limit_bytes=resources.memory_bytes,
            disk_bytes=sample.stats.disk_bytes,
            disk_limit_bytes=resources.disk_bytes,
            pids=sample.stats.pids,
            oom_kills=sample.stats.oom_kills,
        )


class NodeCollector(Collector):
    """MET-4: per-instance usage with its sample age, the node's reservations and admission flags."""

    def __init__(
        self,
        sampler: MetricsSampler,
        admission_open: Callable[[], bool],
        closed_admission: Callable[[], set[str]],
        capacity: Callable[[], Resources | None] = lambda: None,
        cpu_overcommit: float = 1.0,
    ) -> None:
        self.sampler = sampler
        self.admission_open = admission_open
        self.closed_admission = closed_admission
        self.capacity = capacity  # the current capacity sample (None before the first)
        self.cpu_overcommit = cpu_overcommit

    def collect(self) -> Iterator[Metric]:
        node = self.sampler.node
        controllers = self.sampler.controllers()
        instance = ["node", "environment", "tenant", "execution"]
        cpu = CounterMetricFamily("adx_environment_cpu_seconds", "CPU time used by the execution", labels=instance)
        gauges = {
            name: GaugeMetricFamily(f"adx_environment_{name}", text, labels=instance)
            for name, text in (
                ("cpu_percent", "share of the CPU limit used between the last two samples"),
                ("memory_bytes", "memory in use"),
                ("memory_limit_bytes", "memory limit (0: none)"),
                ("disk_bytes", "bytes in the writable layer"),
                ("pids", "processes and threads"),
                ("oom_kills", "OOM kills in the execution"),
                ("sample_age_seconds", "age of the sample these values come from"),
            )
        }
        now = time.monotonic()
        for env_id, controller in sorted(controllers.items()):
            sample = self.sampler.cache.current(controller)
            if sample is None:
                continue
            labels = [node, env_id, sample.tenant, sample.execution_id]
            cpu.add_metric(labels, sample.stats.cpu_usage_seconds)
            if sample.cpu_percent is not None:
                gauges["cpu_percent"].add_metric(labels, sample.cpu_percent)
            gauges["memory_bytes"].add_metric(labels, sample.stats.memory_bytes)
            gauges["memory_limit_bytes"].add_metric(labels, controller.record.spec.resources.memory_bytes)
            gauges["disk_bytes"].add_metric(labels, sample.stats.disk_bytes)
            gauges["pids"].add_metric(labels, sample.stats.pids)
            gauges["oom_kills"].add_metric(labels, sample.stats.oom_kills)
            gauges["sample_age_seconds"].add_metric(labels, max(now - sample.taken_at, 0.0))
        yield cpu
        yield from gauges.values()

        reserved = Resources()
        states: dict[str, int] = dict.fromkeys((state.value for state in EnvironmentState), 0)
        for controller in controllers.values():
            states[controller.state.value] += 1
            if controller.state in _HOLDING or (controller.state is S.FAILED and controller.record.restart_pending):
                reserved = reserved + controller.record.spec.resources
        for name, value in (
            ("cpu_millis", reserved.cpu_millis),
            ("memory_bytes", reserved.memory_bytes),
            ("disk_bytes", reserved.disk_bytes),
        ):
            family = GaugeMetricFamily(
                f"adx_node_reserved_{name}", "resources held by this node's Environments", labels=["node"]
            )
            family.add_metric([node], value)
            yield family
        yield from self._capacity_families(node, reserved)
        by_state = GaugeMetricFamily("adx_node_environments", "Environments by state", labels=["node", "state"])
        for state, count in sorted(states.items()):
            by_state.add_metric([node, state], count)
        yield by_state
        admission = GaugeMetricFamily(
            "adx_node_admission_open", "1 while the node admits new Environments", labels=["node"]
        )
        admission.add_metric([node], 1.0 if self.admission_open() else 0.0)
        yield admission
        closed = GaugeMetricFamily(
            "adx_node_closed_admissions", "Environments whose data-plane admission is closed (pausing)", labels=["node"]
        )
        closed.add_metric([node], len(self.closed_admission()))
        yield closed

    def _capacity_families(self, node: str, reserved: Resources) -> Iterator[Metric]:
        """RES-4, honest about overcommit: the sampled capacity, the limit reservations may reach (CPU times the
        ratio), and what is left of it (allocatable = max(limit - reserved, 0))."""
        ratio = GaugeMetricFamily(
            "adx_node_cpu_overcommit_ratio", "CPU reservations may reach capacity times this", labels=["node"]
        )
        ratio.add_metric([node], self.cpu_overcommit)
        yield ratio
        capacity = self.capacity()
        if capacity is None:
            return  # no sample yet: no figure rather than a false zero
        limit = admission_limit(capacity, self.cpu_overcommit)
        free = allocatable(limit, reserved)
        for kind, amounts, text in (
            ("capacity", capacity, "the node's capacity sample"),
            ("limit", limit, "what reservations may reach: capacity, CPU times the overcommit ratio"),
            ("allocatable", free, "what is left for new Environments: max(limit - reserved, 0)"),
        ):
            for name in ("cpu_millis", "memory_bytes", "disk_bytes"):
                family = GaugeMetricFamily(f"adx_node_{kind}_{name}", text, labels=["node"])
                family.add_metric([node], getattr(amounts, name))
                yield family


def metrics_registry(collector: NodeCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
