"""What ``adx up`` starts beyond Redis and PostgreSQL: the single-node cluster.

certificates -> sandboxd (it installs execd's runtime itself) -> Coordinator -> node -> API server/Ingress
-> a tenant key; each a managed process with its state under the state directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from adx._certs import Identity, component_paths, init_ca, issue
from adx._fs import atomic_write_json
from adx._grpc_errors import from_rpc_error
from adx._grpc_tls import channel_credentials
from adx.cli._cluster import ClusterInfo, write_cluster
from adx.config import UpConfig
from adx.embedded import ManagedServer
from adx.embedded._adx_daemons import ApiDaemon, CoordinatorDaemon, NodeDaemon, SandboxdDaemon
from adx.embedded._process import pick_free_port
from adx.model import IssuedKey
from adx.proto import coordinator_pb2, coordinator_pb2_grpc


def credentials_file() -> Path:
    """Where the SDK and CLI look for credentials: ``$XDG_CONFIG_HOME/adx/credentials.json``."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "adx" / "credentials.json"


@dataclass
class Cluster:
    certs: Path
    sandboxd: SandboxdDaemon
    coordinator: CoordinatorDaemon
    node: NodeDaemon
    api: ApiDaemon

    @property
    def servers(self) -> list[ManagedServer]:
        return [self.sandboxd, self.coordinator, self.node, self.api]


def cgroup_parent_name(state_dir: Path) -> str:
    """One cgroup parent per state directory: two clusters on one machine never touch each other's sandboxes."""
    return "adx-" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:10]


def _ensure_certs(directory: Path, node_name: str) -> None:
    init_ca(directory)
    for identity in (Identity("coordinator", "main"), Identity("node", node_name), Identity("api", "main")):
        if not component_paths(directory, identity).cert.exists():
            issue(directory, identity)


def plan_cluster(cfg: UpConfig, state_dir: Path, redis_url: str, postgres_url: str) -> Cluster:
    certs = state_dir / "certs"
    _ensure_certs(certs, cfg.node_name)
    api_credentials = channel_credentials(component_paths(certs, Identity("api", "main")))
    sandboxd_socket = state_dir / "sandboxd" / "api" / "sandboxd.sock"
    cgroup_parent = cgroup_parent_name(state_dir)

    sandboxd = SandboxdDaemon(
        state_dir,
        socket_path=sandboxd_socket,
        config=lambda _port: {
            "state_dir": str(state_dir / "sandboxd" / "data"),
            "socket_path": str(sandboxd_socket),
            "cgroup_parent": cgroup_parent,
            # sandboxd is the node's local backstop: it admits as far as the node's placement does.
            "capacity": {"cpu_overcommit": cfg.node_cpu_overcommit},
            "base_image": cfg.base_image,
            "disk_quota": cfg.disk_quota,
        },
    )
    coordinator = CoordinatorDaemon(
        state_dir,
        credentials=api_credentials,
        config=lambda port: {
            "listen": f"127.0.0.1:{port}",
            "redis_url": redis_url,
            "certs_dir": str(certs),
        },
    )

    def coordinator_address() -> str:
        info = coordinator.read_info()
        assert info is not None, "the Coordinator starts before the node and the API"
        return f"localhost:{info.port}"

    node = NodeDaemon(
        state_dir,
        credentials=api_credentials,
        config=lambda port: {
            "name": cfg.node_name,
            "listen": f"127.0.0.1:{port}",
            "relay_listen": f"127.0.0.1:{pick_free_port('127.0.0.1')}",
            "coordinator": coordinator_address(),
            "certs_dir": str(certs),
            "state_dir": str(state_dir / "node" / "data"),
            # Results finished while the Coordinator or Redis is away survive an adxlet crash (docs/outages.md).
            "degradation_journal": str(state_dir / "node" / "data" / "journal.sqlite3"),
            "resource_source": {"kind": "sandboxd", "socket": str(sandboxd_socket)},
            "runtime": {"socket": str(sandboxd_socket), "volumes_dir": str(state_dir / "volumes")},
            "metrics_listen": cfg.node_metrics_listen,
            "cpu_overcommit": cfg.node_cpu_overcommit,
        },
    )
    api_host, _, api_port = cfg.api_listen.rpartition(":")
    api = ApiDaemon(
        state_dir,
        host=api_host or "127.0.0.1",
        port=int(api_port),
        config=lambda port: {
            "listen": f"{api_host or '127.0.0.1'}:{port}",
            "coordinator": coordinator_address(),
            "certs_dir": str(certs),
            # The cluster's PostgreSQL holds the durable agent runs: /v1/agent-runs answers for them.
            "agent_database_url": postgres_url,
            "images_dir": str(state_dir / "sandboxd" / "data" / "images"),  # sandboxd's: unknown images are 422
            "volumes_dir": str(state_dir / "volumes"),  # the node's too: named volumes (docs/volumes.md)
            "image_build_socket": str(sandboxd_socket),  # E2B template builds run on this node (docs/e2b.md)
        },
    )
    return Cluster(certs, sandboxd, coordinator, node, api)


def ensure_tenant_key(cluster: Cluster, state_dir: Path, tenant: str, api_url: str) -> tuple[str, bool]:
    """The tenant's API key: created once, kept in the state dir (0600) and in the SDK's credentials file."""
    saved = state_dir / "credentials.json"
    if saved.exists():
        data = json.loads(saved.read_text())
        if data.get("tenant") == tenant:
            _write_user_credentials(api_url, data["api_key"])
            return str(data["api_key"]), False
    info = cluster.coordinator.read_info()
    assert info is not None
    credentials = channel_credentials(component_paths(cluster.certs, Identity("api", "main")))
    with grpc.secure_channel(f"localhost:{info.port}", credentials) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            reply = stub.CreateTenant(coordinator_pb2.CreateTenantRequest(name=tenant), timeout=10)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, "create tenant") from None  # type: ignore[arg-type]
    atomic_write_json(saved, {"tenant": tenant, "api_key": reply.api_key})
    _write_user_credentials(api_url, reply.api_key)
    return reply.api_key, True


ADMIN_FILE = "admin.json"


def admin_credentials_file() -> Path:
    """Where the CLI finds the admin key: ``$XDG_CONFIG_HOME/adx/admin.json``, beside the tenant credentials."""
    return credentials_file().with_name(ADMIN_FILE)


def ensure_admin_key(cluster: Cluster, state_dir: Path, api_url: str) -> tuple[str, bool]:
    """The cluster's admin key: created once (only its hash is in the Coordinator's store), kept in
    ``state_dir/admin.json`` and the user's ``admin.json`` (0600). A saved key the store no longer knows (a new
    Redis) is replaced. Returns (key, created)."""
    saved = state_dir / ADMIN_FILE
    info = cluster.coordinator.read_info()
    assert info is not None
    credentials = channel_credentials(component_paths(cluster.certs, Identity("api", "main")))
    with grpc.secure_channel(f"localhost:{info.port}", credentials) as channel:
        stub = coordinator_pb2_grpc.CoordinatorAdminStub(channel)
        key = None
        if saved.exists():
            key = json.loads(saved.read_text()).get("admin_key")
            try:
                stub.AuthenticateAdmin(coordinator_pb2.AuthenticateAdminRequest(api_key=key), timeout=10)
            except grpc.RpcError as exc:
                if exc.code() is not grpc.StatusCode.NOT_FOUND:
                    raise from_rpc_error(exc, "check the admin key") from None  # type: ignore[arg-type]
                key = None
        created = key is None
        if key is None:
            try:
                reply = stub.CreateAdminKey(coordinator_pb2.CreateAdminKeyRequest(name="admin"), timeout=10)
            except grpc.RpcError as exc:
                raise from_rpc_error(exc, "create the admin key") from None  # type: ignore[arg-type]
            key = IssuedKey.model_validate_json(reply.json).api_key
    record = {"api_url": api_url, "admin_key": key}
    atomic_write_json(saved, record, mode=0o600)
    user_file = admin_credentials_file()
    user_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_json(user_file, record, mode=0o600)
    return str(key), created


def _write_user_credentials(api_url: str, api_key: str) -> None:
    path = credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_json(path, {"api_url": api_url, "api_key": api_key})


def record_cluster(cluster: Cluster, state_dir: Path, redis_url: str, tenant: str, api_url: str) -> list[Path]:
    """Write where this cluster is (cluster.json, beside the credentials): every ``adx`` command finds it."""
    info = cluster.coordinator.read_info()
    assert info is not None, "the Coordinator runs before the cluster is recorded"
    return write_cluster(
        ClusterInfo(
            api_url=api_url,
            coordinator=f"localhost:{info.port}",  # the name its certificate carries
            certs_dir=cluster.certs.absolute(),
            state_dir=state_dir,
            redis_url=redis_url,
            tenant=tenant,
        )
    )
