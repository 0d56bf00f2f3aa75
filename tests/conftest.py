"""Session fixtures: private, real Redis and PostgreSQL server processes (from adx.embedded).

- ``redis_server`` / ``postgres_server``: one instance each for the whole session (do not kill these).
- ``redis_factory`` / ``postgres_factory``: per-test instances a test may SIGKILL and restart.
- ``postgres_dsn``: a fresh, empty database on the session server for one test.
- ``coordinator_cluster``: a real Coordinator on a private Redis, with a CA that issues node certificates.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from fake_internet import fake_internet  # noqa: F401  (the network tests' test host, a fixture for every directory)
from psycopg import sql

from adx._certs import Identity, init_ca, issue
from adx._grpc_tls import channel_credentials
from adx.config import CoordinatorConfig, PostgresServerConfig, RedisServerConfig
from adx.coordinator._daemon import RunningCoordinator, start_coordinator
from adx.embedded import EmbeddedPostgres, EmbeddedRedis, ServerInfo
from adx.proto import coordinator_pb2_grpc

# `adx up` makes the Debian base image by default (a ~1.5-4 min build per state directory). Tests that start it
# get the host-derived base unless they ask for Debian (e2b_up.running_up(base_image="debian") with the image
# seeded from the shared cache, tests/helpers/image_cache.py): one Debian build per machine, not one per test.
os.environ.setdefault("ADX_UP__BASE_IMAGE", "host")
# Nor a btrfs pool (disk_quota "auto"): a loop mount per test state directory that outlives it;
# tests/cli/test_up_disk_quota.py runs the default.
os.environ.setdefault("ADX_UP__DISK_QUOTA", "off")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A run on another PostgreSQL version (ADX_TEST_POSTGRES_MAJOR, scripts/test's second pass) keeps only the
    tests whose database is the session server: the rest start their own PostgreSQL 16 (adx up, adx agent dev)
    and would only repeat the first pass."""
    if os.environ.get("ADX_TEST_POSTGRES_MAJOR", "16") == "16":
        return
    kept = [item for item in items if "postgres_server" in getattr(item, "fixturenames", ())]
    deselected = [item for item in items if "postgres_server" not in getattr(item, "fixturenames", ())]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("session-redis"))
    info = server.start()
    yield info
    server.stop()


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """The session's PostgreSQL; ADX_TEST_POSTGRES_MAJOR=17 runs the tests on PostgreSQL 17 (scripts/test's
    second pass over tests/agents, AGT-18)."""
    major = int(os.environ.get("ADX_TEST_POSTGRES_MAJOR", "16"))
    server = EmbeddedPostgres(
        tmp_path_factory.mktemp("session-pg"), PostgresServerConfig.model_validate({"major": major})
    )
    info = server.start()
    yield info
    server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: ServerInfo) -> Iterator[str]:
    """A new empty database on the session PostgreSQL server, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = postgres_server.url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield postgres_server.url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedRedis]]:
    """Start private Redis servers for one test; each may be SIGKILLed and ``start()``ed again."""
    made: list[EmbeddedRedis] = []

    def make(name: str = "redis", **config: object) -> EmbeddedRedis:
        server = EmbeddedRedis(tmp_path / name, RedisServerConfig.model_validate(config))
        server.start()
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def postgres_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedPostgres]]:
    """Start private PostgreSQL servers for one test; each may be SIGKILLed and ``start()``ed again."""
    made: list[EmbeddedPostgres] = []

    def make(name: str = "pg", **config: object) -> EmbeddedPostgres:
        server = EmbeddedPostgres(tmp_path / name, PostgresServerConfig.model_validate(config))
        server.start()
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


@dataclass
class CoordinatorCluster:
    """A real Coordinator (in-process gRPC server with mutual TLS) on a private real Redis."""

    redis: EmbeddedRedis
    certs: Path
    coordinator: RunningCoordinator
    config: CoordinatorConfig

    @property
    def target(self) -> str:
        return f"localhost:{self.coordinator.port}"

    def node_credentials(self, node: str) -> grpc.ChannelCredentials:
        return channel_credentials(issue(self.certs, Identity("node", node)))

    def stub(self, node: str) -> tuple[grpc.aio.Channel, Any]:
        channel = grpc.aio.secure_channel(self.target, self.node_credentials(node))
        return channel, coordinator_pb2_grpc.CoordinatorStub(channel)


@pytest.fixture
async def coordinator_cluster(
    redis_factory: Callable[..., EmbeddedRedis], tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[tuple[CoordinatorCluster, Any]]]]:
    """``await make(session_ttl=.., redis_timeout=.., before_start=async fn(redis_url), resume_retry=..)``
    -> (cluster, fn's result).

    ``before_start`` runs against Redis before the Coordinator starts (so the Coordinator must load it).
    """
    running: list[RunningCoordinator] = []

    async def make(
        session_ttl: float = 30.0,
        redis_timeout: float = 5.0,
        before_start: Callable[[str], Awaitable[Any]] | None = None,
        resume_retry: float = 30.0,
    ) -> tuple[CoordinatorCluster, Any]:
        redis_server = redis_factory()
        info = redis_server.read_info()
        assert info is not None
        prepared = await before_start(info.url) if before_start is not None else None
        certs = tmp_path / "certs"
        init_ca(certs)
        issue(certs, Identity("coordinator", "main"))
        config = CoordinatorConfig(
            listen="127.0.0.1:0",
            redis_url=info.url,
            certs_dir=certs,
            session_ttl_seconds=session_ttl,
            redis_timeout_seconds=redis_timeout,
            resume_retry_seconds=resume_retry,
        )
        coordinator = await start_coordinator(config)
        running.append(coordinator)
        return CoordinatorCluster(redis_server, certs, coordinator, config), prepared

    yield make
    for coordinator in running:
        await bounded_teardown("the Coordinator's stop", coordinator.stop(grace=None))


TEARDOWN_SECONDS = 60.0


async def bounded_teardown(what: str, stopping: Awaitable[object]) -> None:
    """A fixture's stop, bounded: a stop that hangs fails its test within a minute, naming what hung and
    printing the stacks of every pending task (a teardown that hung silently until pytest-timeout's 300 s
    showed only an idle event loop)."""
    try:
        await asyncio.wait_for(stopping, TEARDOWN_SECONDS)
    except TimeoutError:
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                print(f"--- pending task {task.get_name()}", file=sys.stderr)
                task.print_stack(file=sys.stderr)
        raise AssertionError(f"teardown: {what} did not finish within {TEARDOWN_SECONDS:g}s") from None


@dataclass
class NodeCluster:
    """A real Coordinator (on Redis) and real adxlets, each with its own real sandboxd."""

    cluster: CoordinatorCluster
    nodes: dict[str, Any]
    sandboxds: dict[str, Any] = field(default_factory=dict)  # node name -> its sandboxd (sbx_helpers.Daemon)

    def api_credentials(self) -> grpc.ChannelCredentials:
        return channel_credentials(issue(self.cluster.certs, Identity("api", "main")))

    def api_cert_paths(self) -> Any:
        return issue(self.cluster.certs, Identity("api", "main"))

    def api_ssl_context(self) -> Any:
        """For HTTPS to a node's Relay: ``httpx.AsyncClient(verify=nc.api_ssl_context())``."""
        from adx._certs import client_ssl_context

        return client_ssl_context(self.api_cert_paths())


@pytest.fixture
async def node_cluster(
    coordinator_cluster: Callable[..., Awaitable[tuple[CoordinatorCluster, Any]]],
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Awaitable[NodeCluster]]]:
    """``await make(nodes=["n1"], capacity={...})``: a Coordinator plus one real adxlet + sandboxd per node.

    Each node reads its capacity from a capacity file (``capacity_file(name)`` to change it).
    """
    import json

    from sbx_helpers import DaemonFactory

    from adx.config import NodeConfig
    from adx.node._agent import NodeAgent

    factory = DaemonFactory(tmp_path / "sandboxd")
    (tmp_path / "sandboxd").mkdir()
    agents: list[Any] = []
    mounts: list[Path] = []

    async def make(
        nodes: tuple[str, ...] = ("n1",),
        capacity: dict[str, int] | None = None,
        report_interval: float = 0.5,
        capacity_valid_for: float = 30.0,
        shared_checkpoints: bool = False,
        metrics_interval: float = 15.0,
        metrics_listen: bool = False,
        node_config: dict[str, Any] | None = None,
        sandboxd_config: dict[str, Any] | None = None,
        sandboxd_resources: bool = False,
        recording: bool = False,
        **coordinator: Any,
    ) -> NodeCluster:
        """``shared_checkpoints``: every node's sandboxd gets the artifact root ``shared`` on one directory (the
        cluster's shared storage, bind-mounted at a different path per node) and its adxlet uses it for
        pauseOptions.storage 'shared'.
        ``metrics_listen``: each adxlet serves /metrics on a free port (``agent.metrics_port``).
        ``node_config`` / ``sandboxd_config``: further settings of every adxlet / sandboxd.
        ``sandboxd_resources``: capacity comes from sandboxd's Resource call instead of a capacity file.
        ``recording``: no sandboxd; every adxlet runs the bench-only recording runtime (nothing runs)."""
        cluster, _ = await coordinator_cluster(**coordinator)
        started: dict[str, Any] = {}
        sandboxds: dict[str, Any] = {}
        shared = tmp_path / "shared-checkpoints"
        shared.mkdir(exist_ok=True)
        for name in nodes:
            if shared_checkpoints:
                # Each node mounts the shared storage at its own path (as NFS clients may): a checkpoint is
                # found by name under the resuming node's mount, never by the publishing node's path.
                mount = tmp_path / f"shared-on-{name}"
                mount.mkdir(exist_ok=True)
                await asyncio.to_thread(subprocess.run, ["mount", "--bind", str(shared), str(mount)], check=True)
                mounts.append(mount)
                extra = {"checkpoint_dirs": {"shared": str(mount)}, **(sandboxd_config or {})}
            else:
                extra = dict(sandboxd_config or {})
            # Off the event loop: sandboxd's start is waited for synchronously, and on a loaded machine it takes
            # longer than the in-process Coordinator's leader lease (5 s), which then expires unrenewed.
            daemon = None if recording else await asyncio.to_thread(factory, name, **extra)
            issue(cluster.certs, Identity("node", name))
            cap_file = tmp_path / f"{name}-capacity.json"
            cap_file.write_text(json.dumps(capacity or {"cpuMillis": 8000, "memoryBytes": 16 * 2**30}))
            config = NodeConfig(
                name=name,
                listen="127.0.0.1:0",
                relay_listen="127.0.0.1:0",
                coordinator=cluster.target,
                certs_dir=cluster.certs,
                state_dir=tmp_path / f"{name}-state",
                report_interval_seconds=report_interval,
                capacity_file=None if sandboxd_resources else cap_file,
                resource_source={"kind": "sandboxd", "socket": daemon.socket, "valid_for_seconds": capacity_valid_for}
                if sandboxd_resources and daemon is not None
                else None,
                capacity_file_valid_for_seconds=capacity_valid_for,
                runtime={"socket": daemon.socket, "ready_timeout_seconds": 30}
                if daemon is not None
                else {"socket": tmp_path / "no-sandboxd.sock", "bench_record_only": True},
                checkpoints={"shared_root": "shared"} if shared_checkpoints else {},
                metrics_interval_seconds=metrics_interval,
                metrics_listen="127.0.0.1:0" if metrics_listen else "",
                **(node_config or {}),
            )
            agent = NodeAgent(config)
            await agent.start()
            agents.append(agent)
            started[name] = agent
            if daemon is not None:
                sandboxds[name] = daemon
        # The Coordinator learns capacities through the node reports; placement needs them.
        made = NodeCluster(cluster, started, sandboxds)
        clusters.append(made)
        return made

    clusters: list[NodeCluster] = []
    yield make
    # Tests restart a node by putting a successor NodeAgent in ``nc.nodes``: stop those too. An agent left
    # running keeps a grpc.aio server alive past its event loop, and grpcio's finaliser for it can hang the
    # interpreter's exit (seen in CI).
    every = {id(agent): agent for agent in agents}
    every.update({id(agent): agent for nc in clusters for agent in nc.nodes.values()})
    hung: list[AssertionError] = []
    for agent in every.values():
        try:
            await bounded_teardown(f"adxlet {agent.name}'s stop", agent.stop())
        except AssertionError as exc:
            hung.append(exc)
        except Exception:  # a successor already stopped it, or its start had failed: nothing to stop
            pass
    factory.cleanup()
    for mount in mounts:
        await asyncio.to_thread(subprocess.run, ["umount", "--lazy", str(mount)], check=False)
    if hung:
        raise hung[0]


_session_exit_status: int | None = None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _session_exit_status
    _session_exit_status = int(exitstatus)


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Exit with the session's status once it is reported.

    Seen twice in full runs (fresh-ci, 2026-12-01): after the summary, pytest's final gc.collect() finalised a
    grpc.aio object whose event loop was long closed, and grpcio's aio shutdown joined its poller thread, which
    sat in epoll_wait for good: the run never ended (CI would hit its time limit). Which test leaves the object
    behind was not found yet; until it is, nothing after the report may hang the exit. ADX_TEST_HARD_EXIT=0
    turns this off (e.g. to hunt the leak)."""
    if _session_exit_status is None or os.environ.get("ADX_TEST_HARD_EXIT", "1") != "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_session_exit_status)
