"""``adx agent dev MODULE``: an embedded PostgreSQL and a worker for one application, for development.

Nothing but PostgreSQL is started (not the whole ``adx up``). The application is imported first, so a
broken module fails before any server starts; the database is migrated and the graphs published before the
banner says how to submit, so what it says works at once. Ctrl-C drains the worker, then stops the server;
its data stays in the state directory for the next start.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable
from pathlib import Path

from adx.agents._catalog import publish_graphs
from adx.agents._config import AgentWorkerConfig
from adx.agents._deploy import build_executables, run_worker
from adx.agents._loading import load_application
from adx.agents._store import AgentStore
from adx.agents._worker import AgentWorkerHealth
from adx.config import PostgresServerConfig
from adx.embedded import EmbeddedPostgres

__all__ = ["run_dev"]


def banner(url: str, tenant: str, graphs: list[tuple[str, str]], where: str) -> str:
    name, version = graphs[0]
    shown_version = version if version.isdigit() else repr(version)
    shown = ", ".join(f"{n}@{v}" for n, v in graphs)
    return (
        f"adx agent dev: serving {shown} for tenant {tenant!r}\n"
        f"  database  {url}  ({where})\n"
        f"  submit    export ADX_AGENT_DATABASE_URL={shlex.quote(url)} ADX_AGENT_TENANT={tenant}\n"
        f"            then in Python: async with await adx.agents.Client.connect() as client:\n"
        f"                                run = await client.submit({name!r}, {{...}}, version={shown_version})\n"
        f"                                print(await client.wait(run))\n"
        f"  runs      adx agent runs list --database-url {shlex.quote(url)} --tenant {tenant}\n"
        "Ctrl-C stops the worker and the database.\n"
    )


async def run_dev(
    target: str,
    *,
    state_dir: Path,
    announce: Callable[[str], None],
    database_url: str | None = None,
    tenant: str = "default",
    port: int = 0,
    slots: int = 4,
) -> AgentWorkerHealth:
    module = load_application(target, field="MODULE")
    graphs = [(g.name, g.version) for g in build_executables(module).graphs()]  # its errors before any server
    server = None
    where = "given with --database-url"
    if database_url is None:
        server = EmbeddedPostgres(state_dir, PostgresServerConfig(port=port))
        database_url = (await asyncio.to_thread(server.start)).url
        where = f"embedded PostgreSQL, data in {server.dir}; stops with this command"
    try:
        cfg = AgentWorkerConfig(
            database_url=database_url,
            tenant_id=tenant,
            registrations=module.__name__,
            slots=slots,
            idle_poll_seconds=0.1,  # a developer's run starts at once
        )
        store = await AgentStore.open(database_url, max_size=2)  # migrates
        try:
            await store.ensure_tenant(tenant)
            await publish_graphs(store, build_executables(module))
        finally:
            await store.close()
        announce(banner(database_url, tenant, graphs, where))
        return await run_worker(cfg, module)
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
