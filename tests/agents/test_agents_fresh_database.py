"""A worker started on an empty database migrates it and works the first time (issue 15)."""

from __future__ import annotations

import ast
import asyncio
import logging
import time
from pathlib import Path

import agents_testapp
import pytest
from agents_helpers import TENANT, build_registry
from agents_workers import start_worker, stop, wait_started, write_config

import adx.agents
from adx.agents import AgentRuns, AgentStore


@pytest.mark.req("AGT-13", "AGT-17")
async def test_worker_first_start_on_an_empty_database(postgres_dsn: str, tmp_path: Path) -> None:
    """No fixture migrates first: the worker process itself meets the empty database, logging at info."""
    config = write_config(tmp_path / "worker.toml", postgres_dsn, TENANT, idle_poll_seconds=0.05)
    log = tmp_path / "worker.log"
    worker = start_worker(config, postgres_dsn, log, ADX_LOG_LEVEL="info")
    try:
        await wait_started(worker, log, 0)
        assert "applied agent migration" in log.read_text()
        store = await AgentStore.open(postgres_dsn, migrate=False)
        try:
            async with store.connection("test setup") as conn:
                await conn.execute(agents_testapp.EFFECTS_DDL)
            runs = AgentRuns(store, build_registry())
            run = await runs.submit(TENANT, "chain", "1", {"count": 0})
            deadline = time.monotonic() + 30
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
    assert code == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


_RESERVED = set(logging.LogRecord("n", 0, "p", 0, "m", None, None).__dict__) | {"message", "asctime"}


def test_no_log_extra_overwrites_a_log_record_attribute() -> None:
    """``extra={"name": ...}`` raises KeyError inside logging, only when that level is enabled."""
    root = Path(adx.agents.__file__).parent
    sources = [*root.rglob("*.py"), root.parent / "cli" / "_agent.py"]
    clashes = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "extra" and isinstance(node.value, ast.Dict):
                for key in node.value.keys:
                    if isinstance(key, ast.Constant) and key.value in _RESERVED:
                        clashes.append(f"{path.name}:{key.lineno}: {key.value}")
    assert not clashes
