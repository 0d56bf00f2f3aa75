"""``adx node``: the node agent (adxlet, ``adx node --config FILE``) and the node admin commands (``adx node
list|cordon|uncordon|drain``, ``adx cluster status``, through the admin API)."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from pydantic import TypeAdapter

from adx.cli._admin_http import AdminHttp, AdminKey, ApiUrl, admin_call, admin_switch, check_name
from adx.cli._app import app, console, fail
from adx.cli._daemon_cmd import COORDINATOR_CLIENT, run_daemon
from adx.cli._output import Json, failing, print_json
from adx.config import NodeConfig
from adx.errors import ConflictError, InvalidInputError
from adx.model import ClusterStatus, DrainEvent, DrainStep, NodeHealth, NodeInfo


async def _run(config: NodeConfig) -> None:
    from adx.node import NodeAgent

    agent = NodeAgent(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stop_event.set)
    await agent.start()
    await agent.stop_event.wait()
    await agent.stop()


node_app = typer.Typer(
    help="Run the node agent (`adx node --config FILE`), or list, cordon, uncordon and drain nodes.",
    invoke_without_command=True,
)
app.add_typer(node_app, name="node")
cluster_app = typer.Typer(help="The cluster's status: nodes, Environments by state, Coordinator leader.")
app.add_typer(cluster_app, name="cluster")

NodeName = Annotated[str, typer.Argument(help="the node's name (`adx node list` shows them)")]


@node_app.callback()
def node(
    ctx: typer.Context,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML file (component 'node'): run the agent", dir_okay=False)
    ] = None,
) -> None:
    """Run the node agent: Controllers for this node's Environments, the node API and the Relay (--config).
    The subcommands administer the cluster's nodes through the admin API."""
    if ctx.invoked_subcommand is not None:
        if config is not None:
            fail(InvalidInputError("--config", f"runs the node agent; `adx node {ctx.invoked_subcommand}` takes none"))
        return
    if config is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)
    run_daemon(NodeConfig, "node", config, lambda cfg: asyncio.run(_run(cfg)), COORDINATOR_CLIENT)


NODE_LIST = TypeAdapter(list[NodeInfo])


def _res(free: int, total: int, fmt: Callable[[int], str]) -> str:
    return f"{fmt(free)}/{fmt(total)}"


def _admission(n: NodeInfo) -> str:
    if n.cordoned:
        return "cordoned"
    if n.admission_open:
        return "open"
    return "closed" + (f" ({n.admission_reason})" if n.admission_reason else "")


def _heartbeat(at: float, now: float) -> str:
    from adx.cli._human import format_duration

    return "never" if at <= 0 else f"{format_duration(max(now - at, 0.0))} ago"


def _envs(states: dict[str, int]) -> str:
    return ",".join(f"{count} {state}" for state, count in states.items()) or "-"


def nodes_table(nodes: list[NodeInfo], now: float) -> str:
    from adx.cli._human import table
    from adx.model import format_bytes, format_cpu

    rows = [
        (
            n.name,
            n.health.value,
            _admission(n),
            _res(n.allocatable.cpu_millis, n.capacity.cpu_millis, format_cpu),
            _res(n.allocatable.memory_bytes, n.capacity.memory_bytes, format_bytes),
            _res(n.allocatable.disk_bytes, n.capacity.disk_bytes, format_bytes),
            f"{format_cpu(n.reserved.cpu_millis)}, {format_bytes(n.reserved.memory_bytes)}",
            _heartbeat(n.last_heartbeat_at, now),
            _envs(n.environments),
        )
        for n in nodes
    ]
    header = ("NAME", "HEALTH", "ADMISSION", "CPU FREE/CAP", "MEMORY FREE/CAP", "DISK FREE/CAP", "RESERVED")
    return table((*header, "HEARTBEAT", "ENVIRONMENTS"), rows)


@node_app.command("list")
def list_(as_json: Json = False, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """List nodes: health, admission, allocatable/capacity, reservations, last heartbeat, Environments."""
    nodes = admin_call(api_url, admin_key, "GET", "/v1/admin/nodes", "list nodes")
    if as_json:
        print_json(nodes)
        return
    sys.stdout.write(nodes_table(NODE_LIST.validate_python(nodes), time.time()))


@node_app.command("cordon")
def cordon(name: NodeName, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Cordon NODE: it admits no new or resumed Environment (its running ones go on)."""
    admin_switch(
        api_url,
        admin_key,
        "node",
        name,
        "cordon",
        "cordoned: it admits no new or resumed Environment; running ones go on",
    )


@node_app.command("uncordon")
def uncordon(name: NodeName, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Let a cordoned NODE admit again."""
    admin_switch(api_url, admin_key, "node", name, "uncordon", "uncordoned: it admits again")


@node_app.command("drain")
def drain(name: NodeName, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Drain NODE: cordon it, then pause every running Environment of it (each resumes on another node on its
    next use when its checkpoint is on shared storage). Paused ones stay paused. Prints each step."""
    failed = 0
    with failing():
        http = AdminHttp.find(api_url, admin_key)
        path = f"/v1/admin/nodes/{check_name('node', name)}/drain"
        for event in http.stream(path, f"drain node {name}", DrainEvent):
            failed += event.step is DrainStep.FAILED
            env = event.environment_id
            what = f"{env} ({event.tenant}, {event.state})" if env else f"node {name}"
            message = f": {event.message}" if event.message else ""
            console.print(f"{event.step.value:<9} {what}{message}", soft_wrap=True, highlight=False, markup=False)
    if failed:
        fail(ConflictError(f"node {name}: {failed} Environment(s) could not be paused (see above); drain again"))


@cluster_app.command("status")
def status(as_json: Json = False, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """The cluster: its nodes, every tenant's Environments by state, and the Coordinator leader."""
    with failing():
        http = AdminHttp.find(api_url, admin_key)
        answer = http.request("GET", "/v1/admin/cluster", "cluster status")
    if as_json:
        print_json(answer)
        return
    cluster = ClusterStatus.model_validate(answer)
    nodes = cluster.nodes
    ready = sum(n.health is NodeHealth.READY for n in nodes)
    out = sys.stdout
    out.write(f"API          {http.api_url}\n")
    out.write(f"Coordinator  {cluster.leader}\n")
    out.write(f"Nodes        {len(nodes)} ({ready} ready, {sum(n.cordoned for n in nodes)} cordoned)\n")
    out.write(f"Environments {_envs(cluster.environments)}\n\n")
    out.write(nodes_table(nodes, cluster.served_at))
