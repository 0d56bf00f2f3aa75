"""``adx up``: the all-in-one single-node cluster (at this stage: the embedded Redis and PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Annotated

import psycopg
import redis
import typer
from rich.markup import escape

from adx._fs import atomic_write_json
from adx.cli._app import app, console, setup_logging
from adx.cli._down import UP_FILE
from adx.cli._output import failing
from adx.cli._up_cluster import (
    admin_credentials_file,
    credentials_file,
    ensure_admin_key,
    ensure_tenant_key,
    plan_cluster,
    record_cluster,
)
from adx.config import BaseImageName, UpConfig, load_model
from adx.embedded import EmbeddedPostgres, EmbeddedRedis, ManagedServer, ServerState
from adx.errors import UnavailableError

log = logging.getLogger("adx.up")


@app.command()
def up(
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="state directory (default ./.adx)", file_okay=False)
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML file (component 'up')", dir_okay=False)] = None,
    base_image: Annotated[
        BaseImageName | None,
        typer.Option(
            "--base-image",
            help="the default image: 'debian' (default; built from Debian's packages on the first start of a state "
            "directory) or 'host' (host-derived, no build); overrides base_image of the config. docs/images.md",
        ),
    ] = None,
) -> None:
    """Start the single-node cluster in the foreground; Ctrl-C stops it cleanly."""
    with failing():
        cfg = load_model(UpConfig, "up", config)
    if state_dir is not None:
        cfg = cfg.model_copy(update={"state_dir": state_dir})
    if base_image is not None:
        cfg = cfg.model_copy(update={"base_image": base_image})
    setup_logging("up", cfg.logging.level if config else None, cfg.logging.format if config else None)
    with failing():
        asyncio.run(_run(cfg))


async def _start(server: ManagedServer, started: list[ManagedServer]) -> None:
    with console.status(f"starting {server.kind} ..."):
        await asyncio.to_thread(server.start)
    started.append(server)


def _info_url(server: ManagedServer) -> str:
    info = server.read_info()
    assert info is not None, f"{server.kind} is not running"
    return info.url


def _print_access(api_url: str, tenant: str, api_key: str, created: bool, recorded: Path) -> None:
    console.print(f"\n[bold]API[/bold]      {api_url}", soft_wrap=True, highlight=False)
    how = f"tenant {tenant}{', new' if created else ''}; saved to {credentials_file()}"
    console.print(f"[bold]API key[/bold]  {api_key}  ({how})", soft_wrap=True, highlight=False)
    console.print(
        f"[bold]Cluster[/bold]  recorded in {recorded}: `adx tenant create NAME`, `adx env list` ... find it "
        "from any directory",
        soft_wrap=True,
        highlight=False,
    )
    for line in client_snippet():
        console.print(line, soft_wrap=True, highlight=False)


def client_snippet() -> list[str]:
    """What `adx up` prints for trying the SDK: runnable as printed (this interpreter has adx), and how to get
    the client into another project (the client alone, without the server stack)."""
    code = (
        'import adx; env = adx.Client().environments.create(cpu=1, memory="512Mi"); '
        'print(env.commands.run("echo hello").stdout); env.delete()'
    )
    lines = [f"\n  {shlex.quote(sys.executable)} -c {shlex.quote(code)}"]
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "pyproject.toml").is_file():
        where = shlex.quote(str(checkout))
        lines.append(f"  From your own project's environment: pip install {where}  (the SDK and CLI client only)")
    return lines


def _print_admin(admin_key: str, created: bool, state_dir: Path) -> None:
    # Shown in full only when it is new: a restart must not spray the cluster's admin credential into logs again.
    saved = f"saved to {state_dir / 'admin.json'} and {admin_credentials_file()}"
    shown = admin_key if created else "(unchanged)"
    console.print(
        f"[bold]Admin key[/bold] {shown}  ({saved}; `adx node list`, `adx tenant list` ... use it)",
        soft_wrap=True,
        highlight=False,
    )


def _check_external(kind: str, url: str) -> None:
    """An external server must answer before anything else starts."""
    try:
        if kind == "redis":
            client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
            try:
                client.ping()
            finally:
                client.close()
        else:
            with psycopg.connect(url, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
    except (redis.RedisError, psycopg.Error) as exc:
        raise UnavailableError(f"external {kind} at {url} does not answer: {str(exc).strip()}") from None


def _print_endpoints(servers: list[ManagedServer], external: dict[str, str], state_dir: Path) -> None:
    # Plain lines, not a table: URLs must never be wrapped or cut when the output is piped or copied.
    console.print(f"[bold]ADX is up[/bold] (state in {state_dir})", soft_wrap=True)
    for kind, url in external.items():
        console.print(f"  {kind:<11} {url}  (external)", soft_wrap=True, highlight=False)
    for server in servers:
        info = server.read_info()
        assert info is not None
        how = "reused" if server.reused else "started"
        console.print(f"  {server.kind:<11} {info.url}  (pid {info.pid}, {how})", soft_wrap=True, highlight=False)


#: sandboxd's log lines about the base image build (its logfmt ``msg="..."``, quotes inside escaped).
_BUILD_STEP = re.compile(r'msg="base image: ((?:[^"\\]|\\.)*)"')
_BUILD_FAILED = re.compile(r'msg="(the Debian base image could not be built: (?:[^"\\]|\\.)*)"')


def base_image_build_state(log_tail: str) -> tuple[str | None, str | None]:
    """(the build's latest step, its error) from the tail of sandboxd's log; None where the log has none yet."""
    steps, failed = _BUILD_STEP.findall(log_tail), _BUILD_FAILED.findall(log_tail)
    return (_unescape(steps[-1]) if steps else None), (_unescape(failed[-1]) if failed else None)


def _shorten(line: str, width: int = 90) -> str:
    """One status line, never wrapped (mmdebstrap's hook lines carry whole commands and paths)."""
    return line if len(line) <= width else line[: width - 3] + "..."


def _unescape(text: str) -> str:
    return text.replace('\\"', '"').replace("\\n", " ")


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _log_tail(path: Path, since: int, size: int = 65536) -> str:
    """The log's last ``size`` bytes written after offset ``since`` (an earlier start's lines are not this one's)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(since, os.fstat(f.fileno()).st_size - size))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


async def _wait_base_image(state_dir: Path, sandboxd_log: Path, since: int, stop: asyncio.Event) -> None:
    """sandboxd builds the Debian base image in the background on the first start of a state directory: say so
    on a plain line (also when stdout is no terminal), show its elapsed time, the usual time and sandboxd's
    latest step meanwhile, and stop waiting when it fails (creates of ``base`` then name the reason)."""
    from adx.images import TYPICAL_BUILD_SECONDS, ImageStore

    store = ImageStore(state_dir / "sandboxd" / "data" / "images" / "store")
    if store.find("base") is not None:
        return
    console.print(
        f"Building the Debian base image from Debian's packages (first start of this state directory; usually "
        f"~{TYPICAL_BUILD_SECONDS}s; --base-image host skips it: docs/images.md)",
        soft_wrap=True,
        highlight=False,
    )

    def poll() -> tuple[bool, str | None, str | None]:  # file reads: in a thread, off the loop
        return store.find("base") is not None, *base_image_build_state(_log_tail(sandboxd_log, since))

    t0 = time.monotonic()
    built, error = False, None
    with console.status("") as status:
        while not stop.is_set() and time.monotonic() - t0 < 1800:
            built, step, error = await asyncio.to_thread(poll)
            if built or error is not None:
                break
            elapsed, line = time.monotonic() - t0, escape(_shorten(step or "starting"))
            status.update(f"base image: {elapsed:.0f}s of usually ~{TYPICAL_BUILD_SECONDS}s: {line}")
            await asyncio.sleep(1)
    if built:
        console.print(f"base image built in {time.monotonic() - t0:.0f}s", highlight=False)
    elif error is not None:
        console.print(
            f"[red]{escape(error)}[/red]\ncreates of the default image are refused; fix it and restart adx up, "
            "or start with --base-image host (docs/images.md)",
            soft_wrap=True,
            highlight=False,
        )
    else:
        console.print(f"[yellow]the base image is not built yet: see {sandboxd_log}[/yellow]", soft_wrap=True)


async def _run(cfg: UpConfig) -> None:
    state_dir = cfg.state_dir.absolute()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # `adx down` finds this process here (to stop it as Ctrl-C does); removed when it stops.
    atomic_write_json(state_dir / UP_FILE, {"pid": os.getpid()}, mode=0o600)
    external = {kind: url for kind, url in (("redis", cfg.redis_url), ("postgres", cfg.postgres_url)) if url}
    for kind, url in external.items():
        await asyncio.to_thread(_check_external, kind, url)
    servers: list[ManagedServer] = []
    if cfg.redis_url is None:
        servers.append(EmbeddedRedis(state_dir, cfg.redis))
    if cfg.postgres_url is None:
        servers.append(EmbeddedPostgres(state_dir, cfg.postgres))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started: list[ManagedServer] = []
    try:
        for server in servers:
            await _start(server, started)
        if not cfg.servers_only:
            redis_url = cfg.redis_url or _info_url(servers[0])
            postgres_url = cfg.postgres_url or _info_url(servers[-1])
            await _migrate_agent_store(postgres_url)
            cluster = await asyncio.to_thread(plan_cluster, cfg, state_dir, redis_url, postgres_url)
            log_start = _log_size(cluster.sandboxd.log_path)  # this start's lines of sandboxd's log begin here
            for server in cluster.servers:
                await _start(server, started)
            servers += cluster.servers
            api_url = _info_url(cluster.api).replace("0.0.0.0", "127.0.0.1")
            api_key, created = await asyncio.to_thread(ensure_tenant_key, cluster, state_dir, cfg.tenant, api_url)
            admin_key, admin_created = await asyncio.to_thread(ensure_admin_key, cluster, state_dir, api_url)
            recorded = await asyncio.to_thread(record_cluster, cluster, state_dir, redis_url, cfg.tenant, api_url)
            if cfg.base_image == "debian":
                await _wait_base_image(state_dir, cluster.sandboxd.log_path, log_start, stop)
            disk_line = await _disk_line(cluster.sandboxd.socket_path)
        _print_endpoints(servers, external, state_dir)
        if not cfg.servers_only:
            _print_access(api_url, cfg.tenant, api_key, created, recorded[-1])
            _print_admin(admin_key, admin_created, state_dir)
            console.print(disk_line, soft_wrap=True, highlight=False)
            if cfg.node_metrics_listen:
                console.print(
                    f"node metrics  http://{cfg.node_metrics_listen}/metrics", soft_wrap=True, highlight=False
                )
        console.print("Press Ctrl-C to stop.")
        await _supervise(servers, cfg, stop)
    finally:
        for server in reversed(started):
            with console.status(f"stopping {server.kind} ..."):
                await asyncio.to_thread(server.stop)
            console.print(f"stopped {server.kind}")
        with contextlib.suppress(FileNotFoundError):
            (state_dir / UP_FILE).unlink()


async def _disk_line(sandboxd_socket: Path) -> str:
    """Whether an Environment's disk request is a limit here (sandboxd's disk_quota as it resolved)."""
    from adx.sandboxd import SandboxdClient

    async with SandboxdClient(sandboxd_socket, timeout=10) as client:
        health = await client.health()
    if health.disk_quota:
        return "disk: enforced (each Environment's disk request limits its files; pauses are btrfs snapshots)"
    return f"[yellow]disk: not enforced ({escape(health.disk_quota_note or 'unknown')}); docs/sandboxd.md[/yellow]"


async def _migrate_agent_store(postgres_url: str) -> None:
    """The agent runs' tables exist before the API server answers /v1/agent-runs (a worker would create them
    on its first start; the API server never migrates)."""
    from adx.agents import AgentStore

    store = await AgentStore.open(postgres_url, min_size=1, max_size=1, migrate=True, timeout=30)
    await store.close()


async def _supervise(servers: list[ManagedServer], cfg: UpConfig, stop: asyncio.Event) -> None:
    """Detect crashed servers, report them, restart them on their data (rate-limited)."""
    restarts: dict[str, deque[float]] = {server.kind: deque() for server in servers}
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=cfg.health_interval_seconds)
        if stop.is_set():
            return
        for server in servers:
            status = await asyncio.to_thread(server.status)
            if status.state is ServerState.RUNNING:
                continue
            log.error("%s server is %s: %s", server.kind, status.state.value, status.detail)
            console.print(f"[red]{server.kind} server {status.state.value}[/red]: {status.detail}")
            if status.state is not ServerState.CRASHED:
                continue
            window = restarts[server.kind]
            now = time.monotonic()
            while window and now - window[0] > 60:
                window.popleft()
            if len(window) >= cfg.max_restarts_per_minute:
                raise UnavailableError(
                    f"{server.kind} crashed {len(window)} times within a minute; giving up (see {server.log_path})"
                )
            window.append(now)
            info = await asyncio.to_thread(server.start)
            console.print(f"restarted {server.kind} on its existing data: {info.url} (pid {info.pid})")
