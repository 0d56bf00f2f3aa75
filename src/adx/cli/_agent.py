"""``adx agent worker`` (run a durable agent worker for one tenant), ``adx agent dev`` (an embedded PostgreSQL and a
worker for one module) and ``adx agent runs ...`` (operate on runs)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from adx.cli._app import app, console, fail, setup_logging
from adx.cli._daemon_cmd import run_daemon
from adx.cli._output import failing
from adx.config import load_model

if TYPE_CHECKING:
    from adx.agents import AgentRuns, RunPage, RunView

T = TypeVar("T")

agent_app = typer.Typer(help="Durable agent runtime.", no_args_is_help=True)
app.add_typer(agent_app, name="agent")


@agent_app.command("worker")
def worker(
    config: Annotated[Path, typer.Option("--config", help="TOML file (component 'agent-worker')", dir_okay=False)],
) -> None:
    """Run an agent worker until SIGTERM/SIGINT; it drains, then exits."""
    from adx.agents._config import AgentWorkerConfig
    from adx.agents._deploy import run_worker

    health = run_daemon(AgentWorkerConfig, "agent-worker", config, lambda cfg: asyncio.run(run_worker(cfg)))
    console.print(f"agent worker stopped: ticks={health.ticks} executed={health.executed}")


@agent_app.command("dev")
def dev(
    target: Annotated[
        str, typer.Argument(help="MODULE, MODULE:APP or path/to/app.py (the current directory is importable)")
    ],
    state_dir: Annotated[Path, typer.Option("--state-dir", help="where the embedded PostgreSQL keeps its data")] = Path(
        ".adx-dev"
    ),
    database_url: Annotated[
        str | None, typer.Option("--database-url", help="use this PostgreSQL instead of starting an embedded one")
    ] = None,
    tenant: Annotated[str, typer.Option("--tenant", help="tenant the worker serves")] = "default",
    port: Annotated[int, typer.Option("--port", help="embedded PostgreSQL's port (0: a free one)")] = 0,
    slots: Annotated[int, typer.Option("--slots", help="runs driven at once")] = 4,
) -> None:
    """Develop an agent: embedded PostgreSQL, migrated, and a worker for MODULE's graphs, until Ctrl-C."""
    from adx.agents._dev import run_dev

    setup_logging("agent-dev")

    def announce(text: str) -> None:
        _print(text)
        console.file.flush()

    with failing():
        health = asyncio.run(
            run_dev(
                target,
                state_dir=state_dir,
                announce=announce,
                database_url=database_url,
                tenant=tenant,
                port=port,
                slots=slots,
            )
        )
    runs = ", ".join(f"{n} {kind}" for kind, n in sorted(health.executed.items())) or "none"
    _print(f"agent dev stopped (claims ended: {runs}); the database stopped, its data kept in {state_dir}\n")


@agent_app.command("maintenance")
def maintenance(
    config: Annotated[Path, typer.Option("--config", help="TOML file (component 'agent-maintenance')", dir_okay=False)],
) -> None:
    """Run the maintenance role (deadlines, child-run cancellation and settlement, joins, failure convergence)
    for 1-128 tenants until SIGTERM/SIGINT."""
    from adx.agents._config import AgentMaintenanceConfig
    from adx.agents._maintenance import run_maintenance

    health = run_daemon(
        AgentMaintenanceConfig, "agent-maintenance", config, lambda cfg: asyncio.run(run_maintenance(cfg))
    )
    console.print(
        f"agent maintenance stopped: ticks={health.ticks} cancelled={health.deadline_cancellations}"
        f" child_cancellations={health.child_cancellations} joins={health.joins_published}"
        f" convergences={health.failure_convergences} settled={health.children_settled}"
        f" item_errors={health.item_errors}"
    )


runs_app = typer.Typer(
    help="Inspect and operate on durable runs (PostgreSQL: --database-url, ADX_AGENT_DATABASE_URL or a worker"
    " --config).",
    no_args_is_help=True,
)
agent_app.add_typer(runs_app, name="runs")

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config", help="a worker TOML file: its database_url and tenant_id are the defaults", dir_okay=False
    ),
]
DatabaseOpt = Annotated[
    str | None, typer.Option("--database-url", help="postgresql://...", envvar="ADX_AGENT_DATABASE_URL")
]
TenantOpt = Annotated[str | None, typer.Option("--tenant", help="tenant ID", envvar="ADX_AGENT_TENANT")]
RunArg = Annotated[str, typer.Argument(help="run ID (a UUID)")]


def _target(config: Path | None, database_url: str | None, tenant: str | None) -> tuple[str, str]:
    from adx.errors import InvalidInputError

    if config is not None:
        from adx.agents._config import AgentWorkerConfig

        cfg = load_model(AgentWorkerConfig, "agent-worker", config)
        database_url = database_url or cfg.database_url
        tenant = tenant or cfg.tenant_id
    if not database_url:
        raise InvalidInputError("--database-url", "is required (or ADX_AGENT_DATABASE_URL, or --config)")
    if not database_url.startswith(("postgresql://", "postgres://")):
        raise InvalidInputError("--database-url", "must be a postgresql:// URL")
    if not tenant:
        raise InvalidInputError("--tenant", "is required (or ADX_AGENT_TENANT, or --config)")
    return database_url, tenant


def _operate(
    config: Path | None,
    database_url: str | None,
    tenant: str | None,
    action: Callable[[AgentRuns, str], Awaitable[T]],
) -> T:
    """Open the store (no migrations: operating never changes the schema), run ``action(runs, tenant)`` and
    return what it returns; an error ends the command."""
    from adx.agents import AgentRuns, AgentStore

    async def go() -> T:
        url, tenant_id = _target(config, database_url, tenant)
        store = await AgentStore.open(url, min_size=1, max_size=2, migrate=False, timeout=10)
        try:
            return await action(AgentRuns(store), tenant_id)
        finally:
            await store.close()

    with failing():
        return asyncio.run(go())


def _when(at: datetime | None) -> str:
    from adx.cli._human import format_time

    return format_time(at.timestamp()) if at is not None else "-"


def _print(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True, end="")


def _print_page(page: RunPage, empty: str, when: str, cells: Callable[[RunView], tuple[str, str]]) -> None:
    """A page of runs as columns RUN GRAPH STATUS STEP and ``when`` (``cells`` gives the status and the time),
    then the cursor of the next page if there is one; ``empty`` when it has none."""
    from adx.cli._human import table

    if not page.runs:
        _print(empty + "\n")
        return
    rows = [
        (str(v.run_id), f"{v.graph}@{v.graph_version}", status, str(v.checkpoint_seq), at)
        for v in page.runs
        for status, at in [cells(v)]
    ]
    _print(table(("RUN", "GRAPH", "STATUS", "STEP", when), rows))
    if page.next_cursor:
        _print(f"more: --cursor {page.next_cursor}\n")


def _show_run(view: RunView) -> None:
    lines = [
        ("run", str(view.run_id)),
        ("graph", f"{view.graph}@{view.graph_version}"),
        ("status", view.status.value + (" (cancellation requested)" if view.cancel_requested else "")),
        ("checkpoint", str(view.checkpoint_seq)),
        ("fence", f"{view.fence}{' (leased)' if view.leased else ''}"),
        ("created", _when(view.created_at)),
        ("updated", _when(view.updated_at)),
        ("finished", _when(view.finished_at)),
        ("usage", ", ".join(f"{k}={v}" for k, v in view.usage.items())),
    ]
    if view.parent_run_id is not None:
        lines.append(("parent", str(view.parent_run_id)))
    if view.children:
        settled = " (all finished, settled)" if view.children_settled else ""
        lines.append(("children", f"{view.children}{settled}: adx agent runs children {view.run_id}"))
    for wait in view.waits:
        state = "resolved" if wait.resolved else f"due {_when(wait.due_at)}" if wait.due_at else "pending"
        lines.append(("waits on", f"{wait.kind.value} {wait.wait_id!r} ({state})"))
    _print("".join(f"{k:<12} {v}\n" for k, v in lines))


@runs_app.command("list")
def runs_list(
    config: ConfigOpt = None,
    database_url: DatabaseOpt = None,
    tenant: TenantOpt = None,
    status: Annotated[str | None, typer.Option(help="queued, running, waiting, succeeded, failed, cancelled")] = None,
    graph: Annotated[str | None, typer.Option(help="only runs of this graph")] = None,
    limit: Annotated[int, typer.Option(help="runs per page (1-1000)")] = 50,
    cursor: Annotated[str | None, typer.Option(help="the next-page cursor a previous list printed")] = None,
) -> None:
    """List a tenant's runs, newest first."""
    page = _operate(
        config,
        database_url,
        tenant,
        lambda runs, tenant_id: runs.list_runs(tenant_id, status=status, graph=graph, limit=limit, cursor=cursor),
    )
    _print_page(page, "no runs", "CREATED", lambda v: (v.status.value, _when(v.created_at)))


@runs_app.command("children")
def runs_children(
    run_id: RunArg,
    config: ConfigOpt = None,
    database_url: DatabaseOpt = None,
    tenant: TenantOpt = None,
    limit: Annotated[int, typer.Option(help="runs per page (1-1000)")] = 100,
    cursor: Annotated[str | None, typer.Option(help="the next-page cursor a previous call printed")] = None,
) -> None:
    """List the child runs a run spawned (ctx.spawn), oldest first."""
    page = _operate(
        config,
        database_url,
        tenant,
        lambda runs, tenant_id: runs.children(tenant_id, run_id, limit=limit, cursor=cursor),
    )

    def cells(v: RunView) -> tuple[str, str]:
        cancelling = v.cancel_requested and not v.finished
        return v.status.value + (" (cancel requested)" if cancelling else ""), _when(v.finished_at)

    _print_page(page, "no children", "FINISHED", cells)


@runs_app.command("get")
def runs_get(
    run_id: RunArg, config: ConfigOpt = None, database_url: DatabaseOpt = None, tenant: TenantOpt = None
) -> None:
    """Show one run: status, checkpoint, usage, waits, and its result once finished."""

    async def action(runs: AgentRuns, tenant_id: str) -> None:
        view = await runs.get_run(tenant_id, run_id)
        _show_run(view)
        result = await runs.get_result(tenant_id, view.run_id)
        if result is not None:
            shown = result.artifact if result.failure is None else result.failure
            _print(f"{'result':<12} {json.dumps(shown, sort_keys=True, default=str)}\n")

    _operate(config, database_url, tenant, action)


@runs_app.command("history")
def runs_history(
    run_id: RunArg, config: ConfigOpt = None, database_url: DatabaseOpt = None, tenant: TenantOpt = None
) -> None:
    """A run's journal: node commits, waits, releases, terminal events and operator actions, in order."""
    from adx.cli._human import table

    events = _operate(config, database_url, tenant, lambda runs, tenant_id: runs.history(tenant_id, run_id))
    rows = []
    for e in events:
        detail = e.payload.get("node") or e.payload.get("reason") or e.payload.get("from_checkpoint") or ""
        rows.append(
            (
                _when(e.created_at),
                e.kind,
                "-" if e.fence is None else str(e.fence),
                str(e.checkpoint_seq),
                str(detail)[:80],
            )
        )
    _print(table(("TIME", "EVENT", "FENCE", "CHECKPOINT", "DETAIL"), rows))


@runs_app.command("cancel")
def runs_cancel(
    run_id: RunArg, config: ConfigOpt = None, database_url: DatabaseOpt = None, tenant: TenantOpt = None
) -> None:
    """Ask for cancellation; a worker confirms it (the run ends as cancelled)."""
    view = _operate(config, database_url, tenant, lambda runs, tenant_id: runs.request_cancellation(tenant_id, run_id))
    _print(f"cancellation requested: run {view.run_id} is {view.status.value}\n")


@runs_app.command("resolve")
def runs_resolve(
    run_id: RunArg,
    wait_id: Annotated[str, typer.Argument(help="the interrupt's name, e.g. approve")],
    value: Annotated[str, typer.Option("--value", help="the resolution, as JSON")] = "true",
    config: ConfigOpt = None,
    database_url: DatabaseOpt = None,
    tenant: TenantOpt = None,
) -> None:
    """Resolve an interrupt (an approval); before the run waits on it, it is stored and used then."""
    from adx.errors import InvalidInputError

    try:
        resolution = json.loads(value)
    except json.JSONDecodeError as exc:
        fail(InvalidInputError("--value", f"is not JSON: {exc}"))

    outcome = _operate(
        config, database_url, tenant, lambda runs, tenant_id: runs.resolve(tenant_id, run_id, wait_id, resolution)
    )
    messages = {
        "resolved": f"resolved {wait_id!r}: the run wakes",
        "stored_early": f"stored: the run has not reached {wait_id!r} yet and will use it there",
        "duplicate": f"{wait_id!r} already had this resolution: nothing changed",
    }
    _print(messages[outcome.value] + "\n")


@runs_app.command("retry")
def runs_retry(
    run_id: RunArg, config: ConfigOpt = None, database_url: DatabaseOpt = None, tenant: TenantOpt = None
) -> None:
    """Go on with a failed run from the last checkpoint before its failure."""
    view = _operate(config, database_url, tenant, lambda runs, tenant_id: runs.retry(tenant_id, run_id))
    _print(f"run {view.run_id} is {view.status.value} again, from checkpoint {view.checkpoint_seq}\n")


@runs_app.command("fork")
def runs_fork(
    run_id: RunArg,
    checkpoint: Annotated[int, typer.Option("--checkpoint", help="the checkpoint to start from (see history)")],
    config: ConfigOpt = None,
    database_url: DatabaseOpt = None,
    tenant: TenantOpt = None,
) -> None:
    """Start a new run from a chosen checkpoint of a run (the run itself is unchanged)."""
    view = _operate(config, database_url, tenant, lambda runs, tenant_id: runs.fork(tenant_id, run_id, checkpoint))
    _print(f"run {view.run_id} forked from {run_id} at checkpoint {checkpoint}: {view.status.value}\n")
