"""Real ``adx agent worker`` processes for the agent tests (started through the CLI, as an operator would)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import agents_testapp
from agents_helpers import TENANT, build_registry

from adx.agents import AgentRuns, AgentStore

HERE = Path(__file__).parent


def write_config(path: Path, dsn: str, tenant: str, **settings: object) -> Path:
    lines = [f'database_url = "{dsn}"', f'tenant_id = "{tenant}"', 'registrations = "agents_testapp"']
    for key, value in settings.items():
        lines.append(f"{key} = {value!r}" if not isinstance(value, str) else f'{key} = "{value}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def start_worker(config: Path, dsn: str, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **extra,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "AGENTS_TEST_DSN": dsn,
    }
    return subprocess.Popen(
        [sys.executable, "-c", "from adx.cli import main; main()", "agent", "worker", "--config", str(config)],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def started_count(log: Path) -> int:
    return log.read_text(errors="replace").count("agent worker started") if log.exists() else 0


def tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


async def wait_started(proc: subprocess.Popen[bytes], log: Path, before: int, within: float = 30.0) -> None:
    """Wait until the worker logged its start (after ``before`` earlier starts in the same log)."""
    deadline = time.monotonic() + within
    while started_count(log) <= before:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited with {proc.returncode}: {tail(log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"worker did not start in {within}s: {tail(log)}")
        await asyncio.sleep(0.02)


async def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    await asyncio.to_thread(proc.wait)


async def stop(proc: subprocess.Popen[bytes], within: float = 30.0) -> int:
    """SIGTERM (drain) and wait; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return await asyncio.to_thread(proc.wait, within)


class WorkerSet:
    """Worker processes of one config and log, by pid; :meth:`spawn` returns once the new one logged its start."""

    def __init__(self, config: Path, dsn: str, log: Path, *, start_within: float = 30.0, **env: str) -> None:
        self.config, self.dsn, self.log, self.env = config, dsn, log, env
        self.start_within = start_within
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._starts = 0

    async def spawn(self) -> None:
        proc = start_worker(self.config, self.dsn, self.log, **self.env)
        await wait_started(proc, self.log, self._starts, self.start_within)
        self._starts += 1
        self.procs[proc.pid] = proc


async def chain_run_by_a_new_worker(dsn: str, work: Path, *, within: float, **env: str) -> Path:
    """A real worker process meets the database at ``dsn`` (migrating it when empty), finishes one run of the
    10-step ``chain`` graph submitted beside it, and stops cleanly (exit 0); returns the worker's log."""
    config = write_config(work / "worker.toml", dsn, TENANT, idle_poll_seconds=0.05)
    log = work / "worker.log"
    worker = start_worker(config, dsn, log, **env)
    try:
        await wait_started(worker, log, 0)
        store = await AgentStore.open(dsn, migrate=False)
        try:
            async with store.connection("test setup") as conn:
                await conn.execute(agents_testapp.EFFECTS_DDL)
            runs = AgentRuns(store, build_registry())
            run = await runs.submit(TENANT, "chain", "1", {"count": 0})
            deadline = time.monotonic() + within
            while not (view := await runs.get_run(TENANT, run.run_id)).finished:
                assert time.monotonic() < deadline, view
                await asyncio.sleep(0.05)
            assert view.status == "succeeded"
            result = await runs.get_result(TENANT, run.run_id)
            assert result is not None and result.artifact == {"count": 10}
        finally:
            await store.close()
    finally:
        code = await stop(worker)
    assert code == 0, tail(log)
    return log
