"""The fault soak's cluster: every ADX daemon a real, separately killable process.

One embedded Redis (``adx.embedded.EmbeddedRedis``: SIGKILL and ``start()`` again on its data), the
Coordinator(s) (``adx coordinator --config``), two nodes (each ``adx sandboxd --config`` + ``adx node
--config`` with its own state dir and cgroup parent) and one ``adx api --config`` (API + Ingress).

Every address is chosen once, up front: a restarted process listens where its peers already dial. Each daemon
appends to its own log file in the run directory; the harness writes a ``--- soak:`` marker line into that
log at every start, fault and restart, so a daemon's log reads alongside the fault schedule.

``SoakCluster.supervise`` restarts a daemon that exits while it should be up (as a supervisor would) and
records the exit: a daemon that dies by itself is part of the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import redis

from adx._certs import Identity, component_paths, init_ca, issue
from adx._grpc_tls import channel_credentials
from adx.config import RedisServerConfig
from adx.embedded import EmbeddedRedis
from adx.embedded._adx_daemons import render_toml
from adx.embedded._process import pick_free_port, tail
from adx.proto import coordinator_pb2, coordinator_pb2_grpc, health_pb2, health_pb2_grpc

#: How many ``adx coordinator`` processes share the one Redis: two once Coordinator replicas exist (a leader
#: lease on Redis; clients given every address: ``adx._coordinator_channel``), else one.
#: ``ADX_SOAK_COORDINATORS`` overrides; ``coordinator_setting`` renders the address list for nodes and the API.
#: Until the adxlet dials through it too (it passed its ``coordinator`` string straight to grpc when the HA
#: commit landed: "a:1,b:2" then fails to resolve), a second replica would cut the nodes off whenever it leads.
_SRC = Path(__file__).resolve().parents[2] / "src" / "adx"
HA_LANDED = (_SRC / "_coordinator_channel.py").exists()
NODE_FOLLOWS_REPLICAS = HA_LANDED and "coordinator_channel" in (_SRC / "node" / "_agent.py").read_text()
COORDINATOR_REPLICAS = int(os.environ.get("ADX_SOAK_COORDINATORS", "2" if NODE_FOLLOWS_REPLICAS else "1"))

NODES = ("n1", "n2")


def now() -> str:
    return time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"


def mark(log_path: Path, text: str) -> None:
    """A harness marker line in a daemon's log (between the daemon's own lines)."""
    with contextlib.suppress(OSError), log_path.open("ab") as out:
        out.write(f"--- soak {now()}: {text}\n".encode())


@dataclass
class Exit:
    daemon: str
    at: float  # seconds since the run started
    returncode: int | None
    log_tail: str


class Daemon:
    """One ADX daemon as a child process: start, SIGKILL, SIGSTOP/SIGCONT, terminate, health probe."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        probe: Callable[[], str | None],
        *,
        start_timeout: float = 90.0,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._probe = probe
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.expected_up = False  # the supervisor restarts it when it exits while this is True
        self.stopped = False  # SIGSTOPped by a fault
        self.lock = asyncio.Lock()  # one fault (or restart) at a time per daemon
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        self.starts += 1
        mark(self.log_path, f"starting {self.name} (start #{self.starts})")
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches pytest, which stops everything in order
                close_fds=True,
            )
        self.stopped = False
        self.expected_up = True

    def probe(self) -> str | None:
        """None when healthy (blocking; run it in a thread)."""
        if not self.alive():
            return "not running"
        if self.stopped:
            return "SIGSTOPped"
        try:
            return self._probe()
        except Exception as exc:  # a probe never raises: it answers why not
            return f"probe: {exc!r}"

    async def wait_healthy(self, timeout: float | None = None) -> str | None:  # noqa: ASYNC109
        deadline = time.monotonic() + (timeout or self.start_timeout)
        reason: str | None = "not probed"
        while time.monotonic() < deadline:
            reason = await asyncio.to_thread(self.probe)
            if reason is None:
                return None
            await asyncio.sleep(0.2)
        return reason

    def signal(self, sig: signal.Signals) -> bool:
        if not self.alive():
            return False
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        return True

    def kill(self) -> None:
        """SIGKILL (it may be SIGSTOPped: SIGKILL ends a stopped process too)."""
        if self.signal(signal.SIGKILL):
            assert self.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.stopped = False

    def terminate(self, timeout: float = 15.0) -> None:
        """Clean stop for teardown: SIGCONT (a stopped process cannot handle SIGTERM), SIGTERM, then SIGKILL."""
        self.expected_up = False
        if not self.alive():
            return
        assert self.proc is not None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            mark(self.log_path, f"{self.name} ignored SIGTERM for {timeout:g}s: SIGKILL")
            self.kill()
        self.stopped = False


class RedisDaemon(Daemon):
    """The embedded Redis (its own launcher writes the config and keeps the AOF data across restarts)."""

    def __init__(self, server: EmbeddedRedis, log_path: Path) -> None:
        super().__init__("redis", [], log_path, self._ping)
        self.server = server
        self.url = ""

    @property
    def pid(self) -> int | None:
        info = self.server.read_info()
        return info.pid if info is not None else None

    def alive(self) -> bool:
        info = self.server.read_info()
        return info is not None and self.server.is_alive(info)

    def spawn(self) -> None:
        self.starts += 1
        mark(self.log_path, f"starting redis (start #{self.starts})")
        info = self.server.start()  # blocks until it answers; on its existing data
        self.url = info.url
        self.stopped = False
        self.expected_up = True

    def _ping(self) -> str | None:
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        try:
            client.ping()
        except redis.RedisError as exc:
            return f"ping: {exc}"
        finally:
            client.close()
        return None

    def signal(self, sig: signal.Signals) -> bool:
        pid = self.pid
        if pid is None or not self.alive():
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        return True

    def kill(self) -> None:
        if self.signal(signal.SIGKILL):
            with contextlib.suppress(Exception):
                self.server.wait_exited(10)
        self.stopped = False

    def terminate(self, timeout: float = 15.0) -> None:
        self.expected_up = False
        self.signal(signal.SIGCONT)
        with contextlib.suppress(Exception):
            self.server.stop()
        self.stopped = False


def _grpc_probe(target: str, credentials: grpc.ChannelCredentials) -> str | None:
    try:
        with grpc.secure_channel(target, credentials) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2.0)
    except grpc.RpcError as exc:
        return f"health: {exc.code().name}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"not serving: {reply.detail}"
    return None


def _unix_probe(path: Path) -> str | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
        try:
            sock.connect(str(path))
        except OSError as exc:
            return f"socket not accepting: {exc.strerror or exc}"
    return None


def _http_probe(url: str) -> str | None:
    try:
        response = httpx.get(url, timeout=2.0)
    except httpx.HTTPError as exc:
        return f"healthz: {exc!r}"
    return None if response.status_code == 200 else f"healthz answered {response.status_code}"


@dataclass
class NodeProcesses:
    name: str
    sandboxd: Daemon
    adxlet: Daemon
    sandboxd_state: Path
    sandboxd_socket: Path
    cgroup_parent: str  # relative to each cgroup hierarchy root
    journal: Path  # the adxlet's degradation_journal (JRN-1: absent while nothing is pending)


@dataclass
class SoakCluster:
    """Build with ``SoakCluster.create(run_dir)``, then ``await start()``; always ``close()``."""

    run_dir: Path
    certs: Path
    redis: RedisDaemon
    coordinators: list[Daemon]
    nodes: dict[str, NodeProcesses]
    api: Daemon
    api_url: str
    cgroup_root_parent: str
    socket_dirs: list[Path]
    api_key: str = ""
    started_at: float = field(default_factory=time.monotonic)
    exits: list[Exit] = field(default_factory=list)
    restarts_by_supervisor: int = 0

    # -- construction -------------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path) -> SoakCluster:
        logs = run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        certs = run_dir / "certs"
        init_ca(certs)
        api_credentials = channel_credentials(issue(certs, Identity("api", "main")))
        issue(certs, Identity("coordinator", "main"))

        redis_port = pick_free_port("127.0.0.1")
        redis_server = EmbeddedRedis(run_dir / "redis", RedisServerConfig(port=redis_port))
        redis_daemon = RedisDaemon(redis_server, redis_server.log_path)
        redis_url = f"redis://127.0.0.1:{redis_port}/0"

        coordinators: list[Daemon] = []
        coordinator_addresses: list[str] = []
        for index in range(COORDINATOR_REPLICAS):
            port = pick_free_port("127.0.0.1")
            name = f"coordinator-{index}"
            config = run_dir / f"{name}.toml"
            config.write_text(
                render_toml(
                    {
                        "listen": f"127.0.0.1:{port}",
                        "redis_url": redis_url,
                        "certs_dir": str(certs),
                        "session_ttl_seconds": 10.0,
                        "redis_timeout_seconds": 3.0,
                        "node_rpc_timeout_seconds": 10.0,
                        **({"leader_lease_seconds": 3.0} if HA_LANDED else {}),
                    }
                )
            )
            coordinator_addresses.append(f"localhost:{port}")
            # A replica is healthy when its process runs: a standby does not even listen (HA). That SOME replica
            # serves is the cluster's check (``active_coordinator``).
            coordinators.append(
                Daemon(
                    name,
                    [sys.executable, "-m", "adx", "coordinator", "--config", str(config)],
                    logs / f"{name}.log",
                    lambda: None,
                )
            )
        coordinator = coordinator_setting(coordinator_addresses)

        cgroup_root_parent = f"adx-soak-{uuid.uuid4().hex[:10]}"
        nodes: dict[str, NodeProcesses] = {}
        socket_dirs: list[Path] = []
        for name in NODES:
            issue(certs, Identity("node", name))
            sock_dir = Path(tempfile.mkdtemp(prefix=f"adxsoak-{name}-", dir="/tmp"))
            os.rmdir(sock_dir)  # sandboxd creates it 0700 itself
            socket_dirs.append(sock_dir)
            sandboxd_socket = sock_dir / "sandboxd.sock"
            sandboxd_state = run_dir / name / "sandboxd"
            cgroup_parent = f"{cgroup_root_parent}/{name}"
            sandboxd_config = run_dir / f"{name}-sandboxd.toml"
            sandboxd_config.write_text(
                render_toml(
                    {
                        "state_dir": str(sandboxd_state),
                        "socket_path": str(sandboxd_socket),
                        "cgroup_parent": cgroup_parent,
                        "maintenance_interval_seconds": 0.5,
                        "delete_timeout_seconds": 5.0,
                        # sandboxd's own admission must not refuse before the node's: quotas overcommit.
                        "capacity": {"cpu_millis": 1_000_000},
                        "defaults": {"cpu_millis": 250, "memory_bytes": 128 << 20},
                    }
                )
            )
            sandboxd = Daemon(
                f"{name}/sandboxd",
                [sys.executable, "-m", "adx", "sandboxd", "--config", str(sandboxd_config)],
                logs / f"{name}-sandboxd.log",
                lambda path=sandboxd_socket: _unix_probe(path),  # type: ignore[misc]
            )
            node_port = pick_free_port("127.0.0.1")
            relay_port = pick_free_port("127.0.0.1")
            journal = run_dir / name / "node" / "journal.sqlite"
            node_config = run_dir / f"{name}-node.toml"
            node_config.write_text(
                render_toml(
                    {
                        "name": name,
                        "listen": f"127.0.0.1:{node_port}",
                        "relay_listen": f"127.0.0.1:{relay_port}",
                        "coordinator": coordinator,
                        "certs_dir": str(certs),
                        "state_dir": str(run_dir / name / "node"),
                        "report_interval_seconds": 1.0,
                        "rpc_timeout_seconds": 5.0,
                        "degradation_journal": str(journal),
                        "resource_source": {"kind": "sandboxd", "socket": str(sandboxd_socket)},
                        "runtime": {"socket": str(sandboxd_socket), "ready_timeout_seconds": 30},
                    }
                )
            )
            node_target = f"localhost:{node_port}"
            adxlet = Daemon(
                f"{name}/adxlet",
                [sys.executable, "-m", "adx", "node", "--config", str(node_config)],
                logs / f"{name}-adxlet.log",
                lambda target=node_target: _grpc_probe(target, api_credentials),  # type: ignore[misc]
            )
            nodes[name] = NodeProcesses(name, sandboxd, adxlet, sandboxd_state, sandboxd_socket, cgroup_parent, journal)

        api_port = pick_free_port("127.0.0.1")
        api_url = f"http://127.0.0.1:{api_port}"
        api_config = run_dir / "api.toml"
        api_config.write_text(
            render_toml({"listen": f"127.0.0.1:{api_port}", "coordinator": coordinator, "certs_dir": str(certs)})
        )
        api = Daemon(
            "api",
            [sys.executable, "-m", "adx", "api", "--config", str(api_config)],
            logs / "api.log",
            lambda: _http_probe(f"{api_url}/healthz"),
        )
        return cls(
            run_dir=run_dir,
            certs=certs,
            redis=redis_daemon,
            coordinators=coordinators,
            nodes=nodes,
            api=api,
            api_url=api_url,
            cgroup_root_parent=cgroup_root_parent,
            socket_dirs=socket_dirs,
        )

    # -- views --------------------------------------------------------------------------------------
    @property
    def daemons(self) -> list[Daemon]:
        """Every daemon in start order (the fault schedule's targets, in this order)."""
        out: list[Daemon] = [self.redis, *self.coordinators]
        for node in self.nodes.values():
            out += [node.sandboxd, node.adxlet]
        return [*out, self.api]

    def daemon(self, name: str) -> Daemon:
        for daemon in self.daemons:
            if daemon.name == name:
                return daemon
        raise KeyError(name)

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    # -- start, supervise, stop ---------------------------------------------------------------------
    async def start(self) -> None:
        """Redis, Coordinator(s), each node's sandboxd then adxlet, the API; then a tenant API key."""
        await asyncio.to_thread(self.redis.spawn)
        for daemon in self.daemons[1:]:
            await asyncio.to_thread(daemon.spawn)
            reason = await daemon.wait_healthy()
            if reason is None and daemon is self.coordinators[-1]:
                reason = await self.wait_active_coordinator()
            if reason is not None:
                raise AssertionError(f"{daemon.name} did not become healthy: {reason}\n{tail(daemon.log_path, 30)}")
        self.api_key = await asyncio.to_thread(self._create_tenant)
        self.started_at = time.monotonic()

    def active_coordinator(self) -> str | None:
        """The target of the replica that serves (None if none does)."""
        credentials = self.api_credentials()
        for daemon, target in zip(self.coordinators, coordinator_targets(self), strict=True):
            if daemon.alive() and not daemon.stopped and _grpc_probe(target, credentials) is None:
                return target
        return None

    async def wait_active_coordinator(self, timeout: float = 90.0) -> str | None:  # noqa: ASYNC109
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await asyncio.to_thread(self.active_coordinator) is not None:
                return None
            await asyncio.sleep(0.3)
        return f"no Coordinator replica serves after {timeout:g}s"

    def api_credentials(self) -> grpc.ChannelCredentials:
        return channel_credentials(component_paths(self.certs, Identity("api", "main")))

    def _create_tenant(self) -> str:
        target = self.active_coordinator()
        assert target is not None, "no Coordinator serves"
        with grpc.secure_channel(target, self.api_credentials()) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            reply = stub.CreateTenant(coordinator_pb2.CreateTenantRequest(name="soak"), timeout=10)
        return str(reply.api_key)

    async def restart(self, daemon: Daemon) -> None:
        """Start a daemon that is down (Redis: on its data). A failed start is left to the supervisor."""
        try:
            await asyncio.to_thread(daemon.spawn)
        except Exception as exc:  # the supervisor retries: a restart may fail while a peer is down
            mark(daemon.log_path, f"restart of {daemon.name} failed: {exc!r}")
            daemon.expected_up = True

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart any daemon that exited while it should be up; record the exit."""
        while not stop.is_set():
            for daemon in self.daemons:
                if not daemon.expected_up or daemon.lock.locked() or daemon.alive():
                    continue
                async with daemon.lock:
                    if not daemon.expected_up or daemon.alive():
                        continue
                    returncode = daemon.proc.poll() if daemon.proc is not None else None
                    self.exits.append(
                        Exit(daemon.name, round(self.elapsed(), 2), returncode, tail(daemon.log_path, 15))
                    )
                    mark(daemon.log_path, f"supervisor: {daemon.name} is down (status {returncode}); restarting in 1 s")
                    await asyncio.sleep(1.0)
                    self.restarts_by_supervisor += 1
                    await self.restart(daemon)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def bring_all_up(self, timeout: float = 120.0) -> dict[str, str]:  # noqa: ASYNC109
        """SIGCONT anything stopped, start anything down, wait for every health probe. -> {daemon: reason}."""
        for daemon in self.daemons:
            async with daemon.lock:
                if daemon.stopped:
                    daemon.signal(signal.SIGCONT)
                    daemon.stopped = False
                    mark(daemon.log_path, "settle: SIGCONT")
                if not daemon.alive():
                    await self.restart(daemon)
        deadline = time.monotonic() + timeout
        unhealthy: dict[str, str] = {}
        for daemon in self.daemons:
            reason = await daemon.wait_healthy(max(1.0, deadline - time.monotonic()))
            if reason is not None:
                unhealthy[daemon.name] = reason
        reason = await self.wait_active_coordinator(max(1.0, deadline - time.monotonic()))
        if reason is not None:
            unhealthy["coordinator"] = reason
        return unhealthy

    def close(self) -> None:
        """Stop every daemon (reverse order), then kill and remove every sandbox cgroup this run made."""
        from sbx_helpers import _hierarchy_roots, cleanup_cgroup_parent

        for daemon in reversed(self.daemons):
            with contextlib.suppress(Exception):
                daemon.terminate()
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                cleanup_cgroup_parent(node.cgroup_parent)
        for root in _hierarchy_roots():
            with contextlib.suppress(OSError):
                (root / self.cgroup_root_parent).rmdir()
        for directory in self.socket_dirs:
            shutil.rmtree(directory, ignore_errors=True)

    def log_tails(self, lines: int = 40) -> str:
        parts = []
        for daemon in self.daemons:
            parts.append(f"===== {daemon.name}: {daemon.log_path} (last {lines} lines) =====")
            parts.append(tail(daemon.log_path, lines))
        return "\n".join(parts)


def coordinator_targets(cluster: SoakCluster) -> list[str]:
    return [f"localhost:{_port_of(d)}" for d in cluster.coordinators]


def _port_of(daemon: Daemon) -> str:
    config = Path(daemon.argv[-1]).read_text()
    for line in config.splitlines():
        if line.startswith("listen"):
            return line.split('"')[1].rpartition(":")[2]
    raise AssertionError(f"no listen address in {daemon.argv[-1]}")


def coordinator_setting(addresses: list[str]) -> str:
    """The ``coordinator`` value of the node and API configurations: every replica, ``"a:1,b:2"`` (HA clients
    follow the active one)."""
    return ",".join(addresses) if len(addresses) > 1 else addresses[0]
