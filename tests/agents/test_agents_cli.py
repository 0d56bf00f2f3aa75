"""``adx agent worker --config FILE``: configuration errors exit at once naming the key (AGT-13); ``adx agent runs``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from agents_helpers import make_scheduler

from adx.agents import AgentRuns, AgentStore, ExecutableGraphRegistry

CLI = [sys.executable, "-c", "from adx.cli import main; main()", "agent", "worker", "--config"]


def _run(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, str(config)], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.req("AGT-13")
def test_config_errors_name_the_key(tmp_path: Path, postgres_dsn: str) -> None:
    config = tmp_path / "w.toml"
    config.write_text(f'database_url = "{postgres_dsn}"\nregistrations = "agents_testapp"\nslots = 0\n')
    done = _run(config)
    assert done.returncode == 2 and "slots" in done.stderr
    config.write_text(f'database_url = "{postgres_dsn}"\nregistrations = "agents_testapp"\nslotz = 4\n')
    done = _run(config)
    assert done.returncode == 2 and "slotz: unknown key" in done.stderr
    config.write_text(f'database_url = "{postgres_dsn}"\nregistrations = "no_such_module_xyz"\n')
    done = _run(config)
    assert done.returncode == 2 and "registrations" in done.stderr and "no_such_module_xyz" in done.stderr


RUNS_CLI = [sys.executable, "-c", "from adx.cli import main; main()", "agent", "runs"]


def _runs(*args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--database-url", dsn, "--tenant", "acme"] if dsn else []
    return subprocess.run([*RUNS_CLI, *args, *extra], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.req("AGT-16")
async def test_runs_cli_lists_shows_resolves_cancels_and_names_bad_fields(
    store: AgentStore, executables: ExecutableGraphRegistry, postgres_dsn: str
) -> None:
    """``adx agent runs list|get|history|resolve|cancel|retry`` against real PostgreSQL, as an operator."""
    runs = AgentRuns(store, executables)
    done = await runs.submit("acme", "chain", "1", {"count": 0})
    chain = await runs.submit("acme", "chain", "1", {"count": 0})
    await make_scheduler(store, executables).tick()  # the oldest succeeds

    def call(*args: str, dsn: str | None = postgres_dsn) -> subprocess.CompletedProcess[str]:
        return _runs(*args, dsn=dsn)

    listed = await asyncio.to_thread(call, "list")
    assert listed.returncode == 0, listed.stderr
    assert str(done.run_id) in listed.stdout and str(chain.run_id) in listed.stdout
    assert "STATUS" in listed.stdout and "succeeded" in listed.stdout
    only = await asyncio.to_thread(call, "list", "--status", "queued")
    assert str(chain.run_id) in only.stdout and str(done.run_id) not in only.stdout
    bad = await asyncio.to_thread(call, "list", "--status", "done")
    assert bad.returncode != 0 and "status" in bad.stderr

    shown = await asyncio.to_thread(call, "get", str(chain.run_id))
    assert shown.returncode == 0 and "queued" in shown.stdout and "chain@1" in shown.stdout
    typo = await asyncio.to_thread(call, "resolve", str(chain.run_id), "approve")
    assert typo.returncode != 0 and "declares no interrupts" in typo.stderr
    early = await asyncio.to_thread(call, "resolve", str(chain.run_id), "approve", "--value", "{oops")
    assert early.returncode != 0 and "--value" in early.stderr
    cancelled = await asyncio.to_thread(call, "cancel", str(chain.run_id))
    assert cancelled.returncode == 0 and "cancellation requested" in cancelled.stdout
    retry = await asyncio.to_thread(call, "retry", str(chain.run_id))
    assert retry.returncode != 0 and "only a failed run" in retry.stderr
    history = await asyncio.to_thread(call, "history", str(done.run_id))
    assert history.returncode == 0 and "node_committed" in history.stdout and "succeeded" in history.stdout
    forked = await asyncio.to_thread(call, "fork", str(done.run_id), "--checkpoint", "3")
    assert forked.returncode == 0 and "forked from" in forked.stdout and "queued" in forked.stdout
    too_far = await asyncio.to_thread(call, "fork", str(done.run_id), "--checkpoint", "99")
    assert too_far.returncode != 0 and "keeps no checkpoint 99" in too_far.stderr
    missing = await asyncio.to_thread(call, "get", "not-a-uuid")
    assert missing.returncode != 0 and "run_id" in missing.stderr
    unknown = await asyncio.to_thread(call, "get", str(uuid.uuid4()))
    assert unknown.returncode != 0 and "does not exist" in unknown.stderr
    no_db = await asyncio.to_thread(call, "list", dsn=None)
    assert no_db.returncode != 0 and "--database-url" in no_db.stderr
