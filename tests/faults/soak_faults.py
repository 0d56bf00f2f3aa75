"""The fault schedule (a pure function of the seed, the duration and the target list) and its executor.

Kinds:
- ``kill``: SIGKILL, then the supervisor's restart after ``hold`` seconds (on the same data and address);
- ``stop``: SIGSTOP, SIGCONT after ``hold`` seconds (1-10 s);
- ``redis_outage``: Redis SIGKILLed and kept down for 60 s (only in long runs, ``duration >= 600``).

A target is never hit again while its previous fault (plus a recovery margin) is in effect, but faults on
different targets overlap. The executor applies each event at its time; an event whose target is not up at
that moment (a restart still in progress) is recorded as skipped, never shifted: the schedule replays exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from soak_cluster import Daemon, SoakCluster, mark

WARMUP_SECONDS = 10.0  # the workload's first Environments exist before the first fault
QUIET_TAIL_SECONDS = 5.0  # no fault starts this close to the end of the fault phase
LONG_RUN_SECONDS = 600.0
REDIS_OUTAGE_SECONDS = 60.0
KILL_RECOVERY_MARGIN = 15.0  # a restarted daemon needs a moment (registration, recovery) before the next hit
STOP_RECOVERY_MARGIN = 5.0


@dataclass(frozen=True)
class FaultEvent:
    index: int
    at: float  # seconds after the fault phase started
    target: str  # a daemon name: redis, coordinator-0, n1/sandboxd, n1/adxlet, ..., api
    kind: str  # kill | stop | redis_outage
    hold: float  # kill: seconds down before the restart; stop: seconds stopped; outage: seconds down

    def describe(self) -> str:
        return f"#{self.index} t+{self.at:7.2f}s {self.kind:<12} {self.target:<14} hold {self.hold:5.2f}s"


def make_schedule(seed: int, duration: float, targets: list[str]) -> list[FaultEvent]:
    """The same (seed, duration, targets) always gives the same list."""
    rng = random.Random(f"adx-soak-faults:{seed}")
    long_run = duration >= LONG_RUN_SECONDS
    end = duration - QUIET_TAIL_SECONDS
    # Long runs: one 60 s Redis outage per started 600 s, at a seeded moment within each window.
    outages: list[float] = []
    if long_run and "redis" in targets:
        window = 0.0
        while window + LONG_RUN_SECONDS <= duration:
            start = window + rng.uniform(60.0, LONG_RUN_SECONDS - REDIS_OUTAGE_SECONDS - 60.0)
            if start + REDIS_OUTAGE_SECONDS < end:
                outages.append(round(start, 2))
            window += LONG_RUN_SECONDS
    busy_until = dict.fromkeys(targets, 0.0)
    events: list[FaultEvent] = []
    t = WARMUP_SECONDS
    while True:
        t += rng.uniform(2.0, 7.0)
        if t >= end:
            break
        if outages and t >= outages[0]:
            at = outages.pop(0)
            events.append(FaultEvent(len(events), at, "redis", "redis_outage", REDIS_OUTAGE_SECONDS))
            busy_until["redis"] = at + REDIS_OUTAGE_SECONDS + KILL_RECOVERY_MARGIN
            continue
        # Redis stays free for its next outage: no other fault on it may still be in effect then.
        soon = bool(outages) and outages[0] - t < 10.0 + KILL_RECOVERY_MARGIN
        free = [name for name in targets if busy_until[name] <= t and not (name == "redis" and soon)]
        if not free:
            continue
        target = rng.choice(free)
        kind = rng.choice(("kill", "stop"))
        hold = round(rng.uniform(0.2, 5.0) if kind == "kill" else rng.uniform(1.0, 10.0), 2)
        at = round(t, 2)
        events.append(FaultEvent(len(events), at, target, kind, hold))
        busy_until[target] = at + hold + (KILL_RECOVERY_MARGIN if kind == "kill" else STOP_RECOVERY_MARGIN)
    return sorted(events, key=lambda e: (e.at, e.index))


def schedule_digest(events: list[FaultEvent]) -> str:
    """A short fingerprint printed with the seed: two runs of one seed print the same digest."""
    import hashlib

    return hashlib.sha256(json.dumps([asdict(e) for e in events]).encode()).hexdigest()[:12]


@dataclass
class FaultLog:
    applied: list[dict[str, object]] = field(default_factory=list)
    skipped: list[dict[str, object]] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        """{kind: {applied, skipped}} and {kind@target: ...}."""
        out: dict[str, Counter[str]] = {}
        for outcome, rows in (("applied", self.applied), ("skipped", self.skipped)):
            for row in rows:
                for key in (str(row["kind"]), f"{row['kind']}@{row['target']}"):
                    out.setdefault(key, Counter())[outcome] += 1
        return {key: dict(counter) for key, counter in sorted(out.items())}


class FaultRunner:
    def __init__(self, cluster: SoakCluster, events: list[FaultEvent]) -> None:
        self.cluster = cluster
        self.events = events
        self.log = FaultLog()
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self, stop: asyncio.Event) -> None:
        """Apply every event at its time (concurrently across targets); return when all are done."""
        started = time.monotonic()
        for event in self.events:
            delay = started + event.at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                break
            self._tasks.append(asyncio.create_task(self._apply(event), name=f"fault-{event.index}"))
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _apply(self, event: FaultEvent) -> None:
        daemon = self.cluster.daemon(event.target)
        row: dict[str, object] = {**asdict(event), "run_at": round(self.cluster.elapsed(), 2)}
        if daemon.lock.locked():
            self.log.skipped.append({**row, "why": "busy (a restart in progress)"})
            return
        async with daemon.lock:
            if not daemon.alive() or daemon.stopped or not daemon.expected_up:
                self.log.skipped.append({**row, "why": "not up"})
                return
            row["pid"] = daemon.pid
            print(f"[soak {self.cluster.elapsed():7.1f}s] fault {event.describe()} (pid {daemon.pid})", flush=True)
            if event.kind == "stop":
                await self._stop(daemon, event)
            else:
                await self._kill(daemon, event)
            self.log.applied.append(row)

    async def _stop(self, daemon: Daemon, event: FaultEvent) -> None:
        mark(daemon.log_path, f"FAULT #{event.index}: SIGSTOP {daemon.name} for {event.hold:.2f}s")
        daemon.stopped = True
        daemon.signal(signal.SIGSTOP)
        await asyncio.sleep(event.hold)
        daemon.signal(signal.SIGCONT)
        daemon.stopped = False
        mark(daemon.log_path, f"FAULT #{event.index}: SIGCONT {daemon.name}")

    async def _kill(self, daemon: Daemon, event: FaultEvent) -> None:
        mark(daemon.log_path, f"FAULT #{event.index}: SIGKILL {daemon.name}; restart in {event.hold:.2f}s")
        daemon.expected_up = False
        await asyncio.to_thread(daemon.kill)
        await asyncio.sleep(event.hold)
        mark(daemon.log_path, f"FAULT #{event.index}: restarting {daemon.name}")
        await self.cluster.restart(daemon)
