"""Volumes on shared storage (docs/volumes.md "Where volumes live"): with the volume root on storage every node
mounts (here one directory bind-mounted at a different path per node, as NFS clients may), Environments on two
different nodes mount the same volume and see each other's files, and the files outlive both. Real Coordinator,
adxlets, sandboxds, API server and Ingress."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from apistack import ApiStack, api_for  # noqa: F401  (fixture)

import adx


async def test_two_nodes_share_a_volume_through_the_shared_root(node_cluster, api_for, tmp_path: Path) -> None:  # noqa: F811
    # Each node fits one of these Environments at a time, so the two land on different nodes.
    nc = await node_cluster(nodes=("n1", "n2"), capacity={"cpuMillis": 1000, "memoryBytes": 4 * 2**30})
    shared = tmp_path / "shared-volumes"
    shared.mkdir()
    mounts = []
    try:
        for name, agent in nc.nodes.items():
            mount = tmp_path / f"volumes-on-{name}"
            mount.mkdir()
            await asyncio.to_thread(subprocess.run, ["mount", "--bind", str(shared), str(mount)], check=True)
            mounts.append(mount)
            agent.driver.volumes_dir = mount  # the node's runtime.volumes_dir: its own path to the shared root
        stack: ApiStack = await api_for(nc.cluster, volumes_dir=shared)
        key = await stack.tenant("acme")
        async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
            await client.volumes.create("team")
            a = await client.environments.create(cpu=0.8, memory="256Mi", volumes={"/mnt/team": "team"})
            b = await client.environments.create(cpu=0.8, memory="256Mi", volumes={"/srv/team": "team"})
            assert {a.node, b.node} == {"n1", "n2"}
            await a.commands.run("echo from-a > /mnt/team/a.txt")
            await b.commands.run("echo from-b > /srv/team/b.txt")
            assert (await a.commands.run("cat /mnt/team/b.txt")).stdout == "from-b\n"
            assert (await b.commands.run("cat /srv/team/a.txt")).stdout == "from-a\n"
            await a.delete()
            await b.delete()
            c = await client.environments.create(cpu=0.8, memory="256Mi", volumes={"/data": "team"})
            assert (await c.commands.run("cat /data/a.txt /data/b.txt")).stdout == "from-a\nfrom-b\n"
            await c.delete()
            volume = (await client.volumes.list())[0]
            await client.volumes.delete(volume)
        assert list(shared.joinpath("acme").iterdir()) == [shared / "acme" / ".ids"]
    finally:
        for mount in mounts:
            await asyncio.to_thread(subprocess.run, ["umount", "--lazy", str(mount)], check=False)
