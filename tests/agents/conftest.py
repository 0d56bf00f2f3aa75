"""Fixtures for the agent runtime tests: a migrated store on a fresh database per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from agents_helpers import TENANT, build_registry

from adx.agents import AgentRuns, AgentStore, ExecutableGraphRegistry


@pytest.fixture
async def store(postgres_dsn: str) -> AsyncIterator[AgentStore]:
    s = await AgentStore.open(postgres_dsn, max_size=8)
    await s.ensure_tenant(TENANT)
    import agents_testapp

    async with s.connection("test setup") as conn:
        await conn.execute(agents_testapp.EFFECTS_DDL)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def executables() -> ExecutableGraphRegistry:
    return build_registry()


@pytest.fixture
def runs(store: AgentStore, executables: ExecutableGraphRegistry) -> AgentRuns:
    return AgentRuns(store, executables)
