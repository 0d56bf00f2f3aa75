"""Images reach other nodes (issue 13, docs/images.md "Images on several nodes"): a node whose store lacks an
image a create names pulls it from a node that has it, over the node-to-node mTLS channel. Real Coordinator,
adxlets, sandboxds (each with its own store), API server; the Debian base comes from the test image cache
(tests/sandboxd/test_images.py), hard-linked into the first node's store."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
from apistack import ApiStack, api_for  # noqa: F401  (fixture)
from image_cache import cached_debian_store

import adx
from adx.errors import AdxError, NotFoundError, UnavailableError
from adx.images import ImageManifest, ImageStore, layer_digest
from adx.node import _image_pull
from adx.proto import node_pb2 as pb
from adx.sandboxd import SandboxdClient
from adx.sandboxd._image_build import build_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def debian_store() -> ImageStore:
    return cached_debian_store()


def _seed(source: ImageStore, target: ImageStore, name: str) -> None:
    """Give ``target`` image ``name`` of ``source`` (hard links: the layers are read-only)."""
    manifest = source.get(name)
    target.ensure()
    for digest in manifest.layers:
        if not target.has_layer(digest):
            subprocess.run(["cp", "-al", str(source.layers_dir / digest), str(target.layers_dir / digest)], check=True)
    target.put(manifest)


def _random_image(store: ImageStore, name: str, mib: int) -> ImageManifest:
    """An image of one layer holding ``mib`` MiB of random bytes (nothing to run: pulled, not started)."""
    step = f"COPY random {name} {mib}"
    digest = layer_digest(None, step)
    staging = store.staging()
    with open(staging / "tree" / "blob", "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    (staging / "tree" / "etc").mkdir()
    (staging / "tree" / "etc" / "name").write_text(name)
    store.commit_layer(staging, digest, None, step)
    manifest = ImageManifest(name=name, layers=[digest])
    store.put(manifest)
    return manifest


async def _make_full(nc_tmp: Path, name: str) -> None:
    """Shrink node ``name``'s capacity so nothing more is placed there (its next report says so)."""
    (nc_tmp / f"{name}-capacity.json").write_text(json.dumps({"cpuMillis": 100, "memoryBytes": 2**28}))
    await asyncio.sleep(2.0)  # reports every 0.5 s


async def test_an_image_built_on_one_node_runs_on_another(
    node_cluster,
    api_for,  # noqa: F811
    debian_store: ImageStore,
    tmp_path: Path,
) -> None:
    nc = await node_cluster(nodes=("n1", "n2"))
    store_a = await nc.nodes["n1"].images.store()
    store_b = await nc.nodes["n2"].images.store()
    await asyncio.to_thread(_seed, debian_store, store_a, "debian")
    (tmp_path / "ctx").mkdir()
    async with SandboxdClient(nc.sandboxds["n1"].socket) as client:
        built = await build_image(
            client, store_a, "FROM debian\nRUN echo built-on-n1 > /etc/marker\n", "from-n1", context=tmp_path / "ctx"
        )
    assert store_b.find("from-n1") is None and store_b.find("debian") is None
    await _make_full(tmp_path, "n1")
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("acme")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as api:
        started = time.monotonic()
        env = await api.environments.create(image="from-n1", cpu=0.5, memory="256Mi")
        print(f"create of an image pulled from n1: {time.monotonic() - started:.1f}s")
        assert env.node == "n2"
        out = await env.commands.run("cat /etc/marker; id -un")
        assert out.stdout == "built-on-n1\nuser\n"
        pulled = store_b.get("from-n1")
        assert pulled.layers == built.manifest.layers and all(store_b.has_layer(d) for d in pulled.layers)
        # A second create of the image on n2 finds it there: nothing is pulled again.
        assert await nc.nodes["n2"].images.ensure("from-n1") is None
        await env.delete()
        # An image no node has: the create fails, naming the image and that no node has it.
        with pytest.raises(AdxError) as failed:
            await api.environments.create(image="on-no-node", cpu=0.5, memory="256Mi")
        assert "on-no-node" in str(failed.value) and "no node" in str(failed.value), failed.value


async def test_a_layer_corrupted_in_transit_is_refused_then_a_clean_pull_completes(
    node_cluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nc = await node_cluster(nodes=("n1", "n2"))
    store_a = await nc.nodes["n1"].images.store()
    store_b = await nc.nodes["n2"].images.store()
    manifest = await asyncio.to_thread(_random_image, store_a, "small", 3)

    async def flip_a_bit(index: int, chunk: bytes) -> bytes:
        return chunk if index != 1 else chunk[:100] + bytes([chunk[100] ^ 0x10]) + chunk[101:]

    monkeypatch.setattr(_image_pull, "send_fault", flip_a_bit)
    with pytest.raises(UnavailableError) as refused:
        await nc.nodes["n2"].images.pull("small")
    assert refused.value.details["layer"] == manifest.layers[0] and "refused" in refused.value.message
    assert store_b.find("small") is None and not store_b.has_layer(manifest.layers[0])
    assert [p.name for p in store_b.layers_dir.iterdir() if p.name.startswith(".tmp-")] == []  # nothing half-written
    monkeypatch.setattr(_image_pull, "send_fault", None)
    report = await nc.nodes["n2"].images.pull("small")
    assert report is not None and report.source == "n1" and report.layers_pulled == manifest.layers
    blob = f"layers/{manifest.layers[0]}/tree/blob"
    assert (store_b.root / blob).read_bytes() == (store_a.root / blob).read_bytes()


async def test_concurrent_creates_of_one_image_pull_each_layer_once(
    node_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    nc = await node_cluster(nodes=("n1", "n2"))
    store_a = await nc.nodes["n1"].images.store()
    manifest = await asyncio.to_thread(_random_image, store_a, "shared", 2)
    # A second image on the same bottom layer: pulled at the same time, that layer still crosses once.
    top = layer_digest(manifest.layers[0], "RUN nothing")
    store_a.commit_layer(store_a.staging(), top, manifest.layers[0], "RUN nothing")
    store_a.put(ImageManifest(name="shared-plus", layers=[*manifest.layers, top]))
    served: list[str] = []
    real = _image_pull.layer_chunks

    def counting(store: ImageStore, digest: str) -> AsyncGenerator[pb.LayerChunk, None]:
        served.append(digest)
        return real(store, digest)

    monkeypatch.setattr("adx.node._service.layer_chunks", counting)
    names = ["shared", "shared-plus"] * 3
    reports = await asyncio.gather(*(nc.nodes["n2"].images.ensure(name) for name in names))
    assert sorted(served) == sorted([*manifest.layers, top])  # each layer once
    assert len({id(r) for r in reports}) == 2  # one pull per image, shared by its callers
    assert sum(len(r.layers_pulled) for r in {id(r): r for r in reports if r}.values()) == 2


_PULL_SCRIPT = """
import asyncio, sys
from pathlib import Path
from adx._certs import Identity, component_paths
from adx._grpc_tls import channel_credentials
from adx.node._image_pull import ImagePuller

async def main(certs, store, address):
    async def path():
        return Path(store)
    async def peers():
        return {"n1": address}
    puller = ImagePuller("n2", channel_credentials(component_paths(Path(certs), Identity("node", "n2"))), path, peers)
    await puller.pull("slow")

asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_pull_killed_mid_layer_leaves_no_layer_and_a_retry_completes(
    node_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    nc = await node_cluster(nodes=("n1", "n2"))
    store_a = await nc.nodes["n1"].images.store()
    store_b = await nc.nodes["n2"].images.store()
    manifest = await asyncio.to_thread(_random_image, store_a, "slow", 8)
    digest = manifest.layers[0]

    async def slowly(index: int, chunk: bytes) -> bytes:
        await asyncio.sleep(0.5)
        return chunk

    monkeypatch.setattr(_image_pull, "send_fault", slowly)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _PULL_SCRIPT,
        str(nc.cluster.certs),
        str(store_b.root),
        f"127.0.0.1:{nc.nodes['n1'].port}",
        stderr=asyncio.subprocess.PIPE,
    )
    staging = store_b.layers_dir / "never"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # killed once part of the layer is on disk
        found = [p for p in store_b.layers_dir.glob(f".tmp-pull-{proc.pid}-*")] if store_b.layers_dir.is_dir() else []
        if found and (found[0] / "tree" / "blob").is_file() and (found[0] / "tree" / "blob").stat().st_size > 0:
            staging = found[0]
            break
        assert proc.returncode is None, await proc.stderr.read() if proc.stderr else ""
        await asyncio.sleep(0.05)
    assert staging.name.startswith(".tmp-pull-"), "the pull never wrote part of its layer"
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not store_b.has_layer(digest) and not (store_b.layers_dir / digest).exists()
    assert store_b.find("slow") is None
    monkeypatch.setattr(_image_pull, "send_fault", None)
    report = await nc.nodes["n2"].images.ensure("slow")  # the node's own pull: automatic, as at create
    assert report is not None and report.layers_pulled == [digest]
    assert not staging.exists()  # the killed pull's debris is gone
    assert store_b.get("slow").layers == [digest]
    assert (store_b.layer_tree(digest) / "blob").stat().st_size == 8 << 20


async def test_an_image_on_no_node_is_not_found_naming_it(node_cluster) -> None:
    nc = await node_cluster(nodes=("n1", "n2"))
    with pytest.raises(NotFoundError) as missing:
        await nc.nodes["n2"].images.ensure("nowhere")
    assert missing.value.details == {"field": "image", "image": "nowhere"}
    assert "'nowhere'" in missing.value.message and "n1" in missing.value.message


async def test_the_nodes_own_images_are_never_pulled(
    node_cluster,
    api_for,  # noqa: F811
) -> None:
    """``base`` and ``host`` are every node's own (the host-derived skeleton or the node's base): a create naming
    one runs on its node and is never looked for in a store or on a peer."""
    nc = await node_cluster(nodes=("n1", "n2"))
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("acme")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as api:
        for image in ("host", "base"):
            env = await api.environments.create(image=image, cpu=0.5, memory="256Mi")
            assert (await env.commands.run("true")).exit_code == 0, image
            await env.delete()
