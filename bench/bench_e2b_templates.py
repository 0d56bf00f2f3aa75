"""E2B ``Template.build`` beside the same steps built directly by ADX's image builder, one run, one ``adx up``.

    uv run python bench/bench_e2b_templates.py [--rounds 3]

Figures (each round uses a fresh marker, so "cold" steps really run; the Debian base comes from the test image
cache, ``ADX_TEST_IMAGE_CACHE``, or is built once):
- ``e2b_template_build_cold``: ``Template.build`` of FROM base, RUN, COPY (a 1 MiB file), RUN, ENV through the
  real SDK: request, upload, start, background build on sandboxd, status polling (the SDK polls every 0.2 s).
- ``e2b_template_build_cached``: the same template again: nothing uploaded, every step from the cache.
- ``adx_build_cold`` / ``adx_build_cached`` (baselines): the equivalent Dockerfile built in this process by
  ``build_image`` on the same sandboxd socket and store: the builder alone, no HTTP, no upload, no polling.
Prints one JSON object; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _harness import emit, progress, summarize
from bench_api import start_cluster, stop_cluster
from e2b import Template

from adx.images import ImageStore, ensure_debian_image
from adx.sandboxd import SandboxdClient
from adx.sandboxd._image_build import build_image

CACHE = Path(os.environ.get("ADX_TEST_IMAGE_CACHE", "/var/tmp/adx-test-images"))


def _seed_debian(state: Path) -> None:
    """The Debian image into the cluster's store before it starts (hard links from the cache)."""
    cache = ImageStore(CACHE / "store").ensure()
    manifest, _ = ensure_debian_image(cache, progress=progress)
    store = ImageStore(state / "sandboxd" / "data" / "images" / "store").ensure()
    for digest in manifest.layers:
        subprocess.run(["cp", "-al", str(cache.layers_dir / digest), str(store.layers_dir / digest)], check=True)
    store.put(manifest)


def _template(context: Path, marker: str) -> Template:
    return (
        Template(file_context_path=context)
        .from_debian_image("bookworm")
        .run_cmd(f"echo {marker} > /home/user/one")
        .copy("blob.bin", "/home/user/blob.bin")
        .run_cmd(f"echo {marker} > /home/user/two")
        .set_envs({"MARKER": marker})
    )


def _dockerfile(marker: str) -> str:
    return (
        f"FROM debian\nUSER user\nRUN echo {marker} > /home/user/one\nCOPY blob.bin /home/user/blob.bin\n"
        f"RUN echo {marker} > /home/user/two\nENV MARKER={marker}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {k: [] for k in ("e2b_cold", "e2b_cached", "adx_cold", "adx_cached")}
    with tempfile.TemporaryDirectory(prefix="adx-bench-tpl-", dir="/tmp") as tmp:
        base = Path(tmp)
        context = base / "context"
        context.mkdir()
        (context / "blob.bin").write_bytes(os.urandom(1 << 20))
        _seed_debian(base / "state")
        progress("starting adx up")
        proc, url, key = start_cluster(base)
        opts = {"api_url": url, "sandbox_url": url, "api_key": key}
        socket = base / "state" / "sandboxd" / "api" / "sandboxd.sock"
        store = ImageStore(base / "state" / "sandboxd" / "data" / "images" / "store")
        try:
            for round_ in range(args.rounds):
                marker = uuid.uuid4().hex[:12]
                progress(f"round {round_ + 1}/{args.rounds}")
                for label in ("e2b_cold", "e2b_cached"):
                    start = time.perf_counter()
                    Template.build(_template(context, marker), alias=f"bench-{marker}", **opts)
                    samples[label].append(time.perf_counter() - start)

                async def direct(marker: str = marker) -> None:
                    async with SandboxdClient(socket) as client:
                        for label in ("adx_cold", "adx_cached"):
                            start = time.perf_counter()
                            await build_image(
                                client, store, _dockerfile(marker + "x"), f"direct-{marker}", context=context
                            )
                            samples[label].append(time.perf_counter() - start)

                asyncio.run(direct())
        finally:
            stop_cluster(proc)
    figures: dict[str, Any] = {
        "e2b_template_build_cold": summarize(samples["e2b_cold"]),
        "e2b_template_build_cached": summarize(samples["e2b_cached"]),
        "adx_build_cold": summarize(samples["adx_cold"]),
        "adx_build_cached": summarize(samples["adx_cached"]),
    }
    emit("e2b_templates", figures)


if __name__ == "__main__":
    main()
