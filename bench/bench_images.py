"""Image build times: the Debian base image (mmdebstrap) cold and cached, and a 3-step Dockerfile cold, cached
and with its last step changed. Prints ONE JSON object.

Same-run baselines: ``sandbox_run_true_ms``, one sandbox of the built image that runs ``true`` (create ->
exit -> delete, the floor of any RUN step), and the cached builds themselves against the cold ones.

``--store DIR``: the image store to build into (default: a fresh temporary one, so "cold" is cold; a store that
already has the base image's layer makes base_cold a cached figure, reported as such by ``base_cold_built``).
Needs root, cgroups, overlayfs, mmdebstrap and Debian's mirror. Usage: ``uv run python bench/bench_images.py``.

``--pull MIB``: instead, the pull of an image of MIB MiB (one layer of 1 MiB random files) from a node that has
it (the serving side a separate process, as on another host; GetImage + PullLayer over mutual TLS on loopback,
verified, synced, renamed) beside same-run baselines on the same bytes: ``cp -a`` of the layer's tree (a local
copy) and ``tar -c | tar -x``, each with the pull's fsync of every file (the same transformation without gRPC).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _harness import emit, progress
from bench_pause import start_daemon
from bench_sandboxd import cleanup_cgroups

from adx.images import ImageManifest, ImageStore, ensure_debian_image, layer_digest
from adx.images._transfer import fsync_tree
from adx.sandboxd import CreateRequest, ResourcesSpec, SandboxdClient, ref_of
from adx.sandboxd._image_build import build_image

DOCKERFILE = """\
FROM debian
RUN python -m venv /opt/venv && /opt/venv/bin/python -c "import sys; print(sys.prefix)" > /opt/venv/where
COPY app/ /opt/app/
RUN {last}
"""


async def _true_run(client: SandboxdClient, image: str, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        created = await client.create(
            CreateRequest(
                request_id=uuid.uuid4().hex,
                image=image,
                argv=["/bin/true"],
                resources=ResourcesSpec(memory_bytes=256 << 20),
            )
        )
        ref = ref_of(created)
        await client.wait(ref, timeout_seconds=60)
        await client.delete(ref)
        samples.append(time.perf_counter() - t0)
    return samples


async def _dockerfile(client: SandboxdClient, store: ImageStore, ctx: Path, name: str, last: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = await build_image(client, store, DOCKERFILE.format(last=last), name, context=ctx)
    return {
        "seconds": round(time.perf_counter() - t0, 3),
        "steps": [f"{s.status}:{s.text[:40]}" for s in result.steps],
        "built": result.built,
        "cached": result.cached,
    }


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="adx-bench-images-"))
    store_dir = Path(args.store) if args.store else work / "images" / "store"
    store = ImageStore(store_dir).ensure()
    figures: dict[str, Any] = {"store": str(store_dir)}
    progress("base image (mmdebstrap) ...")
    t0 = time.perf_counter()
    _, built = ensure_debian_image(store, progress=progress)
    figures["base_cold_s"] = round(time.perf_counter() - t0, 3)
    figures["base_cold_built"] = built
    t0 = time.perf_counter()
    _, built_again = ensure_debian_image(store)
    figures["base_cached_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    assert not built_again
    base_layer = store.get("debian").layers[0]
    figures["base_size_mib"] = round(store.layer_info(base_layer).size_bytes / (1 << 20), 1)

    # sandboxd must use this store: its images dir is the store's parent.
    parent = f"adx-bench-images-{uuid.uuid4().hex[:8]}"
    (work / "d").mkdir()
    proc, sock = start_daemon(work / "d", parent, quota=False, images_dir=store_dir.parent)
    try:
        async with SandboxdClient(sock) as client:
            ctx = work / "ctx"
            (ctx / "app").mkdir(parents=True)
            (ctx / "app" / "main.py").write_text("print('hello from the app')\n")
            tag = uuid.uuid4().hex[:8]
            name = f"bench-{tag}"
            progress("3-step Dockerfile, cold ...")
            figures["dockerfile_cold"] = await _dockerfile(client, store, ctx, name, f"echo {tag} > /opt/app/tag")
            progress("3-step Dockerfile, cached ...")
            figures["dockerfile_cached"] = await _dockerfile(client, store, ctx, name, f"echo {tag} > /opt/app/tag")
            progress("3-step Dockerfile, last step changed ...")
            figures["dockerfile_last_changed"] = await _dockerfile(
                client, store, ctx, name, f"echo {tag}-2 > /opt/app/tag"
            )
            progress("baseline: sandboxes running true ...")
            samples = await _true_run(client, name, args.n)
            figures["sandbox_run_true_ms"] = round(sorted(samples)[len(samples) // 2] * 1e3, 3)
            store.rm(name)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        cleanup_cgroups(parent)
        shutil.rmtree(work, ignore_errors=True)
    emit("images", figures)


def _random_layer(store: ImageStore, mib: int) -> ImageManifest:
    step = f"bench random {mib} MiB {uuid.uuid4().hex}"
    digest = layer_digest(None, step)
    staging = store.staging()
    for i in range(mib):
        (staging / "tree" / f"f{i:05d}").write_bytes(os.urandom(1 << 20))
    store.commit_layer(staging, digest, None, step)
    manifest = ImageManifest(name="bench-pull", layers=[digest])
    store.put(manifest)
    return manifest


async def _serve(store_dir: Path, certs: Path) -> None:
    """The node that has the image: its NodeService's image calls on ``store_dir`` (prints its port)."""
    import grpc

    from adx._certs import Identity, component_paths
    from adx._grpc_tls import channel_credentials, server_credentials
    from adx.node._image_pull import ImagePuller
    from adx.node._service import NodeService
    from adx.proto import node_pb2_grpc

    paths = component_paths(certs, Identity("node", "a"))

    async def path() -> Path:
        return store_dir

    async def no_peers() -> dict[str, str]:
        return {}

    # NodeService reads only ``agent.images`` for these calls.
    agent = SimpleNamespace(images=ImagePuller("a", channel_credentials(paths), path, no_peers))
    server = grpc.aio.server()
    node_pb2_grpc.add_NodeServicer_to_server(NodeService(agent), server)  # type: ignore[arg-type]
    port = server.add_secure_port("127.0.0.1:0", server_credentials(paths))
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def _timed_sync(argv: list[str], target: Path, *, shell: bool = False) -> float:
    t0 = time.perf_counter()
    subprocess.run(" ".join(argv) if shell else argv, shell=shell, check=True)
    fsync_tree(target)  # as durable as a pulled layer
    return time.perf_counter() - t0


async def pull_main(args: argparse.Namespace) -> None:
    from adx._certs import Identity, component_paths, init_ca, issue
    from adx._grpc_tls import channel_credentials
    from adx.node._image_pull import ImagePuller

    work = Path(tempfile.mkdtemp(prefix="adx-bench-pull-"))
    figures: dict[str, Any] = {"mode": "pull", "mib": args.pull}
    server: asyncio.subprocess.Process | None = None
    try:
        certs = work / "certs"
        init_ca(certs)
        issue(certs, Identity("node", "a"))
        issue(certs, Identity("node", "b"))
        a, b = ImageStore(work / "a").ensure(), ImageStore(work / "b").ensure()
        progress(f"an image of {args.pull} MiB ...")
        manifest = await asyncio.to_thread(_random_layer, a, args.pull)
        tree = a.layer_tree(manifest.layers[0])
        server = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve", str(a.root), "--certs", str(certs), stdout=asyncio.subprocess.PIPE
        )
        assert server.stdout is not None
        port = int(await server.stdout.readline())
        progress("baselines: cp -a, tar | tar ...")
        figures["cp_a_s"] = round(
            await asyncio.to_thread(_timed_sync, ["cp", "-a", str(tree), str(work / "cp")], work), 3
        )
        (work / "tar").mkdir()
        pipe = ["tar", "-C", str(tree), "-cf", "-", ".", "|", "tar", "-C", str(work / "tar"), "-xpf", "-"]
        figures["tar_pipe_s"] = round(await asyncio.to_thread(_timed_sync, pipe, work / "tar", shell=True), 3)

        async def path() -> Path:
            return b.root

        async def peers() -> dict[str, str]:
            return {"a": f"127.0.0.1:{port}"}

        puller = ImagePuller("b", channel_credentials(component_paths(certs, Identity("node", "b"))), path, peers)
        progress("pull ...")
        t0 = time.perf_counter()
        report = await puller.ensure("bench-pull")
        figures["pull_s"] = round(time.perf_counter() - t0, 3)
        assert report is not None and report.layers_pulled == manifest.layers
        figures["pull_bytes"] = report.bytes
        for key in ("cp_a_s", "tar_pipe_s", "pull_s"):
            figures[key.replace("_s", "_mib_per_s")] = round(args.pull / figures[key], 1)
    finally:
        if server is not None:
            server.kill()
            await server.wait()
        shutil.rmtree(work, ignore_errors=True)
    figures["load_1m"] = os.getloadavg()[0]
    emit("images", figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", help="image store dir (default: a fresh one: cold builds)")
    parser.add_argument("--n", type=int, default=5, help="baseline sandboxes")
    parser.add_argument("--pull", type=int, metavar="MIB", help="measure the pull of an image of MIB MiB instead")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # --pull's serving node (a store dir)
    parser.add_argument("--certs", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.serve:
        asyncio.run(_serve(Path(parsed.serve), Path(parsed.certs)))
    elif parsed.pull:
        asyncio.run(pull_main(parsed))
    else:
        asyncio.run(main(parsed))
