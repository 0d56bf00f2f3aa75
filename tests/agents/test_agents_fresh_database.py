"""A worker started on an empty database migrates it and works the first time (issue 15)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
from agents_workers import chain_run_by_a_new_worker

import adx.agents


@pytest.mark.req("AGT-13", "AGT-17")
async def test_worker_first_start_on_an_empty_database(postgres_dsn: str, tmp_path: Path) -> None:
    """No fixture migrates first: the worker process itself meets the empty database, logging at info."""
    log = await chain_run_by_a_new_worker(postgres_dsn, tmp_path, within=30, ADX_LOG_LEVEL="info")
    assert "applied agent migration" in log.read_text()
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
