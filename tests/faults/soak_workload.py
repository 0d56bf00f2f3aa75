"""The soak's workload: a few workers driving Environments through the public SDK while faults happen.

Each worker loops: create a small Environment (half of them ``idle_action=pause`` with a short idle timeout),
run a command, then 1-3 times: write a file with unique content, pause, resume, read every acknowledged file
back; then delete it (or, now and then, keep it for the final checks). Every call may fail with a retryable
error during faults: the worker retries with backoff, up to a deadline per operation, and records only what
was ACKNOWLEDGED (a create that returned an ID, a write that returned OK, a delete that returned).

Random choices come from ``random.Random(f"adx-soak-workload:{seed}:{worker}")``, never from the fault
schedule's generator: the schedule replays exactly whatever the workload does.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

import adx
from adx.errors import AdxError, ConflictError, InvalidInputError, NotFoundError

T = TypeVar("T")

OP_DEADLINE_SECONDS = 150.0  # one operation's retries (faults hold a daemon down for at most 10 s, or 60 s)
MAX_KEPT = 4  # Environments kept (not deleted) for the end checks, over all workers
KEEP_PROBABILITY = 0.25
IDLE_TIMEOUT_SECONDS = 6
STABLE = frozenset({"running", "paused"})


@dataclass
class Violation:
    invariant: str
    subject: str
    detail: str
    at: float  # seconds since the run started

    def line(self) -> str:
        return f"[{self.invariant}] {self.subject}: {self.detail} (t+{self.at:.1f}s)"


@dataclass
class EnvEntry:
    id: str
    kind: str  # "idle-pause" | "default"
    worker: int
    token: str
    acked_at: float
    files: dict[str, str] = field(default_factory=dict)  # acknowledged writes: path -> content
    delete_acked: bool = False
    kept: bool = False
    failed: bool = False
    last_step: str = "created"


class GiveUp(Exception):
    def __init__(self, what: str, last: str) -> None:
        super().__init__(f"{what}: gave up after {OP_DEADLINE_SECONDS:g}s; last error: {last}")
        self.what = what
        self.last = last


class EnvFailed(Exception):
    pass


class Ledger:
    """What the workload saw acknowledged, and what it saw go wrong."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.envs: dict[str, EnvEntry] = {}
        self.violations: list[Violation] = []
        self.stats: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.gave_up: list[str] = []
        self.cycles_started = 0
        self.cycles_completed = 0

    def violation(self, invariant: str, subject: str, detail: str) -> None:
        found = Violation(invariant, subject, detail, round(self.clock(), 2))
        self.violations.append(found)
        print(f"[soak {found.at:7.1f}s] VIOLATION {found.line()}", flush=True)

    @property
    def kept(self) -> int:
        return sum(1 for e in self.envs.values() if e.kept)


def _error_name(exc: BaseException) -> str:
    code = getattr(exc, "code", "")
    return f"{type(exc).__name__}({code})" if code else type(exc).__name__


class Worker:
    def __init__(self, index: int, seed: int, client: adx.AsyncClient, ledger: Ledger) -> None:
        self.index = index
        self.rng = random.Random(f"adx-soak-workload:{seed}:{index}")
        self.client = client
        self.ledger = ledger
        self.spurious: set[tuple[str, str]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            self.ledger.cycles_started += 1
            try:
                await self.cycle(n)
                self.ledger.cycles_completed += 1
            except (GiveUp, EnvFailed) as exc:
                self.ledger.gave_up.append(f"worker {self.index} cycle {n}: {exc}")
                print(f"[soak {self.ledger.clock():7.1f}s] worker {self.index}: {exc}", flush=True)
                await asyncio.sleep(1.0)

    # -- one retried operation ------------------------------------------------------------------------
    async def call(self, what: str, fn: Callable[[], Awaitable[T]], env: adx.AsyncEnvironment | None = None) -> T:
        """``fn`` until it succeeds, retrying what a fault may cause. A 404 for an Environment that the control
        plane still shows is the product answering wrongly (``spurious_not_found``) and is retried too; a 404
        that lasts the whole deadline is raised (the caller decides: vanished, or a lost file)."""
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                result = await fn()
            except NotFoundError as exc:
                # execd's own 404 names the path: the file is not there (for the caller to judge).
                if env is None or exc.details.get("field") == "path" or not await self.still_exists(env.id):
                    raise
                last = f"{_error_name(exc)}: {exc}"
                key = (env.id, what)
                if key not in self.spurious:
                    self.spurious.add(key)
                    self.ledger.violation(
                        "spurious_not_found", env.id, f"{what} answered 404 ({exc}) while the API shows it existing"
                    )
                if time.monotonic() - started > OP_DEADLINE_SECONDS:
                    raise
            except ConflictError as exc:
                if exc.code == "environment_failed":
                    raise
                last = f"{_error_name(exc)}: {exc}"
            except InvalidInputError as exc:
                # Never expected from this workload: a fault must not turn into "your request is invalid".
                self.ledger.violation("spurious_client_error", what, f"{_error_name(exc)}: {exc}")
                last = f"{_error_name(exc)}: {exc}"
            except (AdxError, httpx.HTTPError, OSError) as exc:
                last = f"{_error_name(exc)}: {exc}"
            else:
                self.ledger.stats[what] += 1
                return result
            self.ledger.errors[f"{what}: {last.split(':', 1)[0]}"] += 1
            if time.monotonic() - started > OP_DEADLINE_SECONDS:
                raise GiveUp(what, last)
            attempt += 1
            await asyncio.sleep(min(0.3 * 1.6**attempt, 5.0) * (0.5 + self.rng.random()))

    async def still_exists(self, env_id: str) -> bool:
        """Through the control plane (GET, retried): is the Environment there and not deleted?"""
        for attempt in range(10):
            try:
                state = (await self.client.environments.get(env_id)).state.value
            except NotFoundError:
                return False
            except (AdxError, httpx.HTTPError, OSError):
                await asyncio.sleep(min(0.5 * 2**attempt, 5.0))
                continue
            return state not in ("deleting", "deleted")
        return True  # cannot tell: treat the 404 as transient and let the deadline decide

    async def wait_state(self, env: adx.AsyncEnvironment, states: frozenset[str], what: str) -> None:
        """Poll (with retries) until the Environment is in one of ``states``; failed ends it."""

        async def poll() -> None:
            deadline = time.monotonic() + 20.0
            while True:
                await env.refresh()
                state = env.state.value
                if state in states:
                    return
                if state == "failed":
                    raise EnvFailed(f"{env.id} failed: {env.last_error}")
                if state in ("deleting", "deleted"):
                    raise NotFoundError(f"{env.id} is {state}")
                if time.monotonic() > deadline:
                    raise adx.WaitTimeoutError(f"{env.id} still {state}", env)
                await asyncio.sleep(0.2)

        await self.call(what, poll, env)

    # -- the cycle --------------------------------------------------------------------------------
    async def cycle(self, n: int) -> None:
        rng = self.rng
        idle_pause = rng.random() < 0.5
        token = f"w{self.index}c{n}-{rng.getrandbits(40):010x}"
        key = str(uuid.UUID(int=rng.getrandbits(128)))
        options: dict[str, object] = (
            {"idle_timeout": IDLE_TIMEOUT_SECONDS, "idle_action": "pause"} if idle_pause else {}
        )

        async def create() -> adx.AsyncEnvironment:
            return await self.client.environments.create(
                cpu=0.25, memory="128Mi", wait=False, idempotency_key=key, metadata={"soak": token}, **options
            )

        env = await self.call("create", create)
        entry = EnvEntry(env.id, "idle-pause" if idle_pause else "default", self.index, token, self.ledger.clock())
        self.ledger.envs[env.id] = entry
        try:
            await self._use(env, entry, rng)
        except NotFoundError as exc:
            self.ledger.violation("acknowledged_env_vanished", env.id, f"during {entry.last_step}: {exc}")
        except EnvFailed as exc:
            entry.failed = True
            self.ledger.violation("create_or_env_failed_by_fault", env.id, f"during {entry.last_step}: {exc}")
        except ConflictError as exc:  # environment_failed from the SDK's own wait
            entry.failed = True
            self.ledger.violation("create_or_env_failed_by_fault", env.id, f"during {entry.last_step}: {exc}")

    async def _use(self, env: adx.AsyncEnvironment, entry: EnvEntry, rng: random.Random) -> None:
        usable = STABLE if entry.kind == "idle-pause" else frozenset({"running"})
        entry.last_step = "wait running after create"
        await self.wait_state(env, usable, "wait_running")
        entry.last_step = "command"
        result = await self.call("command", lambda: env.commands.run(f"echo {entry.token}"), env)
        if result.exit_code != 0 or result.stdout.strip() != entry.token:
            self.ledger.violation("command_output", env.id, f"exit {result.exit_code} stdout {result.stdout!r}")
        for cycle in range(rng.randint(1, 3)):
            path = f"/work/{entry.token}-{cycle}"
            content = f"{entry.token}:{cycle}:{rng.getrandbits(64):016x}\n"
            entry.last_step = f"write {path}"
            await self.call("write", lambda p=path, c=content: env.files.write(p, c), env)  # type: ignore[misc]
            entry.files[path] = content
            entry.last_step = f"pause #{cycle + 1}"
            await self.call("pause", lambda: self._pause(env), env)
            entry.last_step = f"resume #{cycle + 1}"
            await self.call("resume", env.resume, env)
            await self.wait_state(env, usable, "wait_running")
            entry.last_step = f"read back after resume #{cycle + 1}"
            await self.check_files(env, entry)
        if rng.random() < KEEP_PROBABILITY and self.ledger.kept < MAX_KEPT:
            entry.kept = True
            entry.last_step = "kept"
            return
        entry.last_step = "delete"
        await self.call("delete", env.delete)
        entry.delete_acked = True
        entry.last_step = "deleted"

    async def _pause(self, env: adx.AsyncEnvironment) -> None:
        try:
            await env.pause()
        except ConflictError as exc:
            # 409 not_running: already paused (an idle pause, or our own earlier attempt whose answer was lost).
            await env.refresh()
            if env.state.value != "paused":
                raise exc from None

    async def check_files(self, env: adx.AsyncEnvironment, entry: EnvEntry) -> None:
        for path, content in entry.files.items():
            try:
                data = await self.call("read", lambda p=path: env.files.read(p), env)  # type: ignore[misc]
            except NotFoundError as exc:
                self.ledger.violation("acknowledged_write_lost", f"{env.id}:{path}", str(exc))
                continue
            if data.decode(errors="replace") != content:
                self.ledger.violation(
                    "acknowledged_write_lost", f"{env.id}:{path}", f"read {data[:80]!r}, wrote {content!r}"
                )


async def run_workload(
    api_url: str, api_key: str, seed: int, workers: int, stop: asyncio.Event, ledger: Ledger
) -> None:
    async with adx.AsyncClient(api_url=api_url, api_key=api_key, timeout=30.0, retries=2) as client:
        await asyncio.gather(*(Worker(i, seed, client, ledger).run(stop) for i in range(workers)))
