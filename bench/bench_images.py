"""Image build times: the Debian base image (mmdebstrap) cold and cached, and a 3-step Dockerfile cold, cached
and with its last step changed. Prints ONE JSON object.

Same-run baselines: ``sandbox_run_true_ms``, one sandbox of the built image that runs ``true`` (create ->
exit -> delete, the floor of any RUN step), and the cached builds themselves against the cold ones.

``--store DIR``: the image store to build into (default: a fresh temporary one, so "cold" is cold; a store that
already has the base image's layer makes base_cold a cached figure, reported as such by ``base_cold_built``).
Needs root, cgroups, overlayfs, mmdebstrap and Debian's mirror. Usage: ``uv run python bench/bench_images.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _harness import emit, progress
from bench_pause import start_daemon
from bench_sandboxd import cleanup_cgroups

from adx.images import ImageStore, ensure_debian_image
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", help="image store dir (default: a fresh one: cold builds)")
    parser.add_argument("--n", type=int, default=5, help="baseline sandboxes")
    asyncio.run(main(parser.parse_args()))
