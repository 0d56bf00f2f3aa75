"""docs/deploy.md followed on three machines of this host (issue 17's must-show "the three-machine test passes
from the documented steps").

Each machine is its own network namespace with the address docs/deploy.md gives it (10.0.0.41-43) and its own
sandboxd and adxlet; the control plane (Redis with a replica and three sentinels, two Coordinator replicas, two
API servers) is another namespace holding the control-plane addresses of the document (10.0.0.11-32). Every
daemon loads the files of deploy/config/ as the document installs them (its absolute paths under that
machine's own root) with the per-machine environment files the document writes; every step is the real
``adx`` command line. An Environment gets a file, is paused, its machine is drained and then cut off the
network, and the Environment resumes on another machine with the file; then the active Coordinator is
SIGKILLed and the standby replica serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from netlab import ADX, Machine, NetLab, Process, copy_files, in_netns, tcp_open, wait_for
from sbx_helpers import _hierarchy_roots, cleanup_cgroup_parent

from adx.embedded._binaries import redis_server_binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MACHINES = {"m1": "10.0.0.41", "m2": "10.0.0.42", "m3": "10.0.0.43"}
REDIS = ["10.0.0.11", "10.0.0.12", "10.0.0.13"]  # primary, replica; a sentinel on each
COORDINATORS = {"coord-a": "10.0.0.21", "coord-b": "10.0.0.22"}
APIS = {"api-a": "10.0.0.31", "api-b": "10.0.0.32"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, cgroups, mounts)")


@pytest.fixture
def lab() -> Iterator[NetLab]:
    # A short root: sandboxd's Unix sockets live under it (108-byte limit).
    root = Path(tempfile.mkdtemp(prefix="adx3m-", dir="/tmp"))
    home = root / "home"
    home.mkdir()
    # No recorded `adx up` cluster may fill in anything: every value comes from the documented files.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADX_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    lab = NetLab(root, env)
    try:
        yield lab
    finally:
        lab.close()
        for name in lab.machines:
            # sandboxd's nftables table was in the machine's namespace: it went with it.
            if name in MACHINES:
                cleanup_cgroup_parent(f"adx-test-{lab.tag}/{name}")
        for hierarchy in _hierarchy_roots():
            with contextlib.suppress(OSError):
                (hierarchy / f"adx-test-{lab.tag}").rmdir()
        for mount in lab.mounts:
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def adx(machine: Machine, *args: str, env: dict[str, str] | None = None) -> str:
    """``adx ARGS`` on ``machine``; its stdout (a failure shows both streams)."""
    result = machine.run(ADX, *args, env=env)
    assert result.returncode == 0, f"adx {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def install(machine: Machine, component: str, env_lines: dict[str, str]) -> None:
    """docs/deploy.md: /etc/adx/<component>.toml from deploy/config/, /etc/adx/<component>.env for this machine."""
    machine.install(f"/etc/adx/{component}.toml", (DEPLOY / "config" / f"{component}.toml").read_text())
    machine.install(f"/etc/adx/{component}.env", "".join(f"{k}={v}\n" for k, v in env_lines.items()))


def start_daemon(machine: Machine, component: str) -> Process:
    """What the unit deploy/systemd/adx-<component>.service runs: EnvironmentFile=, then ExecStart=."""
    env = machine.env_file(f"/etc/adx/{component}.env")
    return machine.start(
        component, ADX, component, "--config", str(machine.path(f"/etc/adx/{component}.toml")), env=env
    )


def start_redis(lab: NetLab, ctl: Machine) -> None:
    """docs/deploy.md's Redis: a primary (10.0.0.11), its replica (10.0.0.12), a sentinel beside each and a
    third on 10.0.0.13, all monitoring the service ``adx``."""
    binary = str(redis_server_binary())
    for index, address in enumerate(REDIS):
        directory = ctl.root / "redis" / address
        directory.mkdir(parents=True)
        if index < 2:
            conf = directory / "redis.conf"
            lines = [f"bind {address}", "port 6379", "protected-mode no", f'dir "{directory}"', "appendonly yes"]
            if index == 1:
                lines.append(f"replicaof {REDIS[0]} 6379")
            conf.write_text("\n".join(lines) + "\n")
            ctl.start(f"redis-{address}", binary, str(conf))
        sentinel = directory / "sentinel.conf"  # the sentinel rewrites it: writable
        sentinel.write_text(
            "\n".join(
                [
                    f"bind {address}",
                    "port 26379",
                    "protected-mode no",
                    f'dir "{directory}"',
                    f"sentinel monitor adx {REDIS[0]} 6379 2",
                    "sentinel down-after-milliseconds adx 5000",
                ]
            )
            + "\n"
        )
        ctl.start(f"sentinel-{address}", binary, str(sentinel), "--sentinel")

    def replicated() -> bool:
        def ask() -> bool:
            try:
                info = redis.Redis(host=REDIS[0], port=6379, socket_timeout=1).info("replication")
                sentinel = redis.Redis(host=REDIS[2], port=26379, socket_timeout=1, decode_responses=True)
                master = sentinel.execute_command("SENTINEL", "get-master-addr-by-name", "adx")
            except redis.RedisError:
                return False
            return info.get("connected_slaves") == 1 and [str(part) for part in master or ()] == [REDIS[0], "6379"]

        return in_netns(ctl.netns, ask)

    wait_for(replicated, "the Redis replica and the sentinels", log=lab.logs)


@pytest.mark.timeout(900)
@pytest.mark.req("CRD-2", "CRD-5")  # the standby loads everything from Redis; resume picks another machine
def test_three_machines_from_the_documented_steps(lab: NetLab) -> None:
    # -- the machines of docs/deploy.md -----------------------------------------------------------------------
    ctl = lab.machine("ctl", *REDIS, *COORDINATORS.values(), *APIS.values())
    # The control-plane hosts share one namespace here; each keeps its own files (its own /etc/adx).
    roles = {name: lab.colocated(name, ctl) for name in [*COORDINATORS, *APIS, "ws"]}
    ws = roles["ws"]  # the operator's workstation: the CA and the CLI
    machines = {name: lab.machine(name, address) for name, address in MACHINES.items()}
    shared = lab.root / "nfs"  # the shared checkpoint storage, mounted on every machine (as NFS would be)
    shared.mkdir()
    for machine in machines.values():
        mount = machine.path("/mnt/adx-checkpoints")
        mount.mkdir(parents=True)
        subprocess.run(["mount", "--bind", str(shared), str(mount)], check=True)
        lab.mounts.append(mount)

    # -- step 1: certificates, issued per machine on the workstation and copied to each ---------------------
    ca = str(ws.path("/etc/adx/ca"))
    adx(ws, "certs", "init", "--dir", ca)
    coordinator_hosts = [arg for address in COORDINATORS.values() for arg in ("--host", address)]
    adx(ws, "certs", "issue", "main", "--kind", "coordinator", *coordinator_hosts, "--dir", ca)
    adx(ws, "certs", "issue", "main", "--kind", "api", *[a for h in APIS.values() for a in ("--host", h)], "--dir", ca)
    for name, address in MACHINES.items():
        adx(ws, "certs", "issue", name, "--kind", "node", "--host", address, "--dir", ca)
    cadir = Path(ca)
    for name in COORDINATORS:
        copy_files(
            [cadir / "ca.pem", cadir / "coordinator-main.pem", cadir / "coordinator-main.key"],
            roles[name].path("/etc/adx/certs"),
        )
    for name in APIS:
        copy_files(
            [cadir / "ca.pem", cadir / "api-main.pem", cadir / "api-main.key"], roles[name].path("/etc/adx/certs")
        )
    for name, machine in machines.items():
        copy_files(
            [cadir / "ca.pem", cadir / f"node-{name}.pem", cadir / f"node-{name}.key"], machine.path("/etc/adx/certs")
        )
    assert not (machines["m1"].path("/etc/adx/certs") / "ca.key").exists()  # the CA key stays on the workstation

    # -- step 2: Redis with Sentinel -------------------------------------------------------------------------
    start_redis(lab, ctl)

    # -- step 3: the Coordinator replicas, then the API servers ---------------------------------------------
    for name, address in COORDINATORS.items():
        install(roles[name], "coordinator", {"ADX_COORDINATOR__LISTEN": f"{address}:7401"})
    coord_a = start_daemon(roles["coord-a"], "coordinator")
    wait_for(lambda: tcp_open(ctl.netns, COORDINATORS["coord-a"], 7401), "coord-a serving", log=lab.logs)
    start_daemon(roles["coord-b"], "coordinator")  # stands by: it does not listen while coord-a holds the lease
    for name, address in APIS.items():
        install(roles[name], "api", {"ADX_API__LISTEN": f"{address}:8080"})
        start_daemon(roles[name], "api")
    for address in APIS.values():
        wait_for(lambda a=address: healthz(ctl, a), f"the API server on {address}", log=lab.logs)
    assert not tcp_open(ctl.netns, COORDINATORS["coord-b"], 7401)

    # -- step 4: on each machine, sandboxd and adxlet --------------------------------------------------------
    for name, address in MACHINES.items():
        machine = machines[name]
        # Only because the three share this host's cgroup tree: each its own cgroup parent.
        install(machine, "sandboxd", {"ADX_SANDBOXD__CGROUP_PARENT": f"adx-test-{lab.tag}/{name}"})
        install(
            machine,
            "node",
            {
                "ADX_NODE__NAME": name,
                "ADX_NODE__LISTEN": f"{address}:7402",
                "ADX_NODE__RELAY_LISTEN": f"{address}:7403",
            },
        )
        node_env = machine.env_file("/etc/adx/node.env")
        adx(machine, "config", "check", str(machine.path("/etc/adx/node.toml")), "--component", "node", env=node_env)
        start_daemon(machine, "sandboxd")
        start_daemon(machine, "node")

    # -- step 5: the admin key and a tenant, on an API server (it holds the api certificate) ----------------
    api_a = roles["api-a"]
    api_config = str(api_a.path("/etc/adx/api.toml"))
    admin_key = adx(api_a, "key", "admin", "--config", api_config).strip()
    tenant_key = adx(api_a, "tenant", "create", "alice", "--config", api_config).strip()
    assert admin_key and tenant_key and admin_key != tenant_key
    # The workstation reaches the cluster through an API server (the load balancer's backends).
    operator = {"ADX_API_URL": f"http://{APIS['api-a']}:8080", "ADX_ADMIN_KEY": admin_key, "ADX_API_KEY": tenant_key}

    def nodes() -> dict[str, dict[str, object]]:
        return {n["name"]: n for n in json.loads(adx(ws, "node", "list", "--json", env=operator))}

    wait_for(
        lambda: {n for n, info in nodes().items() if info["health"] == "ready"} == set(MACHINES),
        "three ready nodes in `adx node list`",
        within=120,
        log=lab.logs,
    )

    # -- the walk-through: an Environment with a file, paused, its machine drained and cut off ---------------
    env = json.loads(adx(ws, "env", "create", "--cpu", "0.25", "--memory", "128Mi", "--json", env=operator))
    env_id, first = env["id"], env["node"]
    assert env["state"] == "running" and first in MACHINES
    adx(ws, "env", "exec", env_id, "--shell", "--", f"echo written-on-{first} > /work/proof.txt", env=operator)
    adx(ws, "env", "pause", env_id, env=operator)
    paused = json.loads(adx(ws, "env", "get", env_id, "--json", env=operator))
    assert paused["state"] == "paused", paused

    drained = adx(ws, "node", "drain", first, env=operator)
    assert env_id in drained, drained
    assert nodes()[first]["cordoned"] is True
    machines[first].cut_off()  # the machine goes away for its service

    # Its next use resumes it on another machine, with its file - through the other API server.
    other_api = {**operator, "ADX_API_URL": f"http://{APIS['api-b']}:8080"}
    out = adx(ws, "env", "exec", env_id, "--", "cat", "/work/proof.txt", env=other_api)
    assert out.strip() == f"written-on-{first}"
    moved = json.loads(adx(ws, "env", "get", env_id, "--json", env=other_api))
    assert moved["state"] == "running" and moved["node"] in MACHINES and moved["node"] != first, moved

    # -- the active Coordinator dies: the standby replica takes over ----------------------------------------
    status = json.loads(adx(ws, "cluster", "status", "--json", env=operator))
    assert f"{COORDINATORS['coord-a']}:7401" in status["leader"], status["leader"]
    coord_a.popen.kill()
    coord_a.popen.wait(10)
    wait_for(lambda: tcp_open(ctl.netns, COORDINATORS["coord-b"], 7401), "coord-b taking over", log=lab.logs)
    status = json.loads(adx(ws, "cluster", "status", "--json", env=operator))
    assert f"{COORDINATORS['coord-b']}:7401" in status["leader"], status["leader"]
    # The cluster works on: a new Environment is placed, the moved one still answers with its file.
    second = json.loads(adx(ws, "env", "create", "--cpu", "0.25", "--memory", "128Mi", "--json", env=operator))
    assert second["state"] == "running" and second["node"] in set(MACHINES) - {first}
    assert adx(ws, "env", "exec", env_id, "--", "cat", "/work/proof.txt", env=operator).strip() == f"written-on-{first}"
    for environment in (env_id, second["id"]):
        adx(ws, "env", "delete", environment, env=operator)


def healthz(ctl: Machine, address: str) -> bool:
    def get() -> bool:
        try:
            return httpx.get(f"http://{address}:8080/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return in_netns(ctl.netns, get)
