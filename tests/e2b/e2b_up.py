"""``adx up`` as a user runs it, for the e2b tests (a real subprocess: Redis, Coordinator, node, sandboxd, API +
Ingress), and two tenants' keys for the real ``e2b`` SDK, which reaches it through ``E2B_API_URL`` /
``E2B_SANDBOX_URL``. A module of its own (not conftest) so that test modules can start another one."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ADX = [sys.executable, "-m", "adx"]
IMAGE_CACHE = Path(os.environ.get("ADX_TEST_IMAGE_CACHE", "/var/tmp/adx-test-images"))


@dataclass(frozen=True)
class Up:
    url: str
    key: str  # tenant "default" (made by adx up)
    other_key: str  # a second tenant
    state: Path
    output: str = ""  # what adx up printed until "Press Ctrl-C"

    def opts(self, key: str | None = None) -> dict[str, str]:
        """Connection options of the e2b SDK (what E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set)."""
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": key or self.key}


@contextlib.contextmanager
def running_up(root: Path, **settings: str) -> Iterator[Up]:
    """``adx up`` with its state under ``root`` (``settings``: more ``ADX_UP__*`` variables), stopped after."""
    state = root / "state"
    env = {**os.environ, "XDG_CONFIG_HOME": str(root / "config"), "ADX_UP__API_LISTEN": "127.0.0.1:0", "COLUMNS": "250"}
    env.update({f"ADX_UP__{k.upper()}": v for k, v in settings.items()})
    proc = subprocess.Popen(
        [*ADX, "up", "--state-dir", str(state)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        seen = ""
        deadline = time.monotonic() + 180
        while "Press Ctrl-C" not in seen:
            assert time.monotonic() < deadline, seen
            line = proc.stdout.readline()
            assert line, f"adx up exited early: {seen}\n{proc.stderr.read() if proc.stderr else ''}"
            seen += line
        credentials = json.loads((root / "config" / "adx" / "credentials.json").read_text())
        match = re.search(r"^  coordinator\s+\S*?:(\d+)", seen, re.M)
        assert match, seen
        coordinator, certs = f"localhost:{match.group(1)}", str(state / "certs")
        made = subprocess.run(
            [*ADX, "tenant", "create", "e2b-other", "--coordinator", coordinator, "--certs-dir", certs],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert made.returncode == 0, made.stderr
        yield Up(credentials["api_url"], credentials["api_key"], made.stdout.strip(), state, seen)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        from sbx_helpers import cleanup_cgroup_parent

        from adx.cli._up_cluster import cgroup_parent_name

        cleanup_cgroup_parent(cgroup_parent_name(state.absolute()))


def seed_debian_image(root: Path, as_base: bool = True) -> bool:
    """Put the Debian image (as ``debian`` and, with ``as_base``, ``base``) into the store of an ``adx up`` with its
    state under ``root``, from the cache tests/sandboxd/test_images.py builds (built here when missing: ~4 min once
    per machine), hard-linked so that sandboxd does not build it again (without ``base``, its start finds the
    layer and only names it ``base``). False when it cannot be had (no mmdebstrap)."""
    import shutil

    from adx.images import ImageStore, ensure_debian_image

    cache = ImageStore(IMAGE_CACHE / "store").ensure()
    if shutil.which("mmdebstrap") is None and cache.find("debian") is None:
        return False
    manifest, _ = ensure_debian_image(cache, progress=print)
    store = ImageStore(root / "state" / "sandboxd" / "data" / "images" / "store").ensure()
    for digest in manifest.layers:
        subprocess.run(["cp", "-al", str(cache.layers_dir / digest), str(store.layers_dir / digest)], check=True)
    store.put(manifest)
    if as_base:
        store.put(manifest.model_copy(update={"name": "base"}))
    return True


@contextlib.contextmanager
def running_debian_up(root: Path) -> Iterator[Up]:
    """``adx up`` whose ``base`` is the Debian image (E2B's base has ``user`` and sudo, as template builds expect),
    seeded from the test cache; the test is skipped where that image cannot be had."""
    import pytest

    if not seed_debian_image(root):
        pytest.skip("building the Debian image needs mmdebstrap")
    with running_up(root, base_image="debian") as running:
        yield running
