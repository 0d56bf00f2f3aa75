"""`adx up` with nothing configured (issue 13): its default image is the Debian one; a sandbox of the default image
(native SDK, and E2B's SDK without a template) runs as ``user`` in ``/home/user`` with ``sudo`` working and
``apt-get`` there. A first start whose build fails says so and why, and still comes up.

The Debian layer comes from the shared test image cache (tests/helpers/image_cache.py: one build per machine),
hard-linked in as ``debian`` only: sandboxd's start still goes through its base image step (finding the layer,
naming it ``base``), without a build per test. The build's progress display is seen by hand (a cold build)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b_up import Up, running_up, seed_debian_image

import adx
from adx.images import ImageStore

pytestmark = pytest.mark.slow

#: user, uid, cwd, HOME, root through sudo, where apt-get is
PROBE = "id -un; id -u; pwd; echo $HOME; sudo -n id -u; command -v apt-get"
EXPECTED = ["user", "1000", "/home/user", "/home/user", "0", "/usr/bin/apt-get"]


@pytest.fixture(scope="module")
def default_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    root = tmp_path_factory.mktemp("default-image")
    if not seed_debian_image(root, as_base=False):
        pytest.skip("building the Debian image needs mmdebstrap")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ADX_UP__BASE_IMAGE", raising=False)  # tests/conftest.py pins 'host' for every other adx up
        with running_up(root) as up:
            yield up


def test_adx_ups_sandboxd_makes_the_debian_image_its_base(default_up: Up) -> None:
    store = ImageStore(default_up.state / "sandboxd" / "data" / "images" / "store")
    assert store.get("base").layers == store.get("debian").layers


def test_the_default_image_is_debian_with_user_sudo_and_apt(default_up: Up) -> None:
    with adx.Client(api_url=default_up.url, api_key=default_up.key) as client:
        env = client.environments.create(cpu=0.5, memory="256Mi")
        try:
            result = env.commands.run(["/bin/sh", "-c", PROBE])
            assert result.exit_code == 0, result.stderr
            assert result.stdout.split() == EXPECTED
            assert env.commands.run(["sh", "-c", "sudo -n apt-get --version | head -1"]).stdout.startswith("apt ")
        finally:
            env.delete()


def test_an_e2b_sandbox_without_a_template_is_the_same(default_up: Up) -> None:
    sandbox = Sandbox.create(**default_up.opts())
    try:
        assert sandbox.commands.run(PROBE).stdout.split() == EXPECTED
    finally:
        sandbox.kill()


def test_a_failed_first_build_is_shown_and_the_cluster_still_comes_up(tmp_path: Path) -> None:
    """The build fails (fault injection, where mmdebstrap or Debian's mirror would): `adx up` prints the reason and
    how to choose the host-derived image instead of waiting, and a create of the default image fails naming it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ADX_UP__BASE_IMAGE", raising=False)
        mp.setenv("ADX_SANDBOXD_FAULTS", "base_image.build:fail")
        with running_up(tmp_path) as up:
            assert "Building the Debian base image from Debian's packages" in up.output
            assert "--base-image host skips it" in up.output
            assert "the Debian base image could not be built: injected fault at base_image.build" in up.output
            assert "or start with --base-image host" in up.output
            with adx.Client(api_url=up.url, api_key=up.key) as client:
                env = client.environments.create(cpu=0.5, memory="256Mi", wait=False)
                deadline = time.monotonic() + 20  # a failed build is no reason to retry the start (a 409)
                while env.refresh().state not in ("failed", "running"):
                    assert time.monotonic() < deadline, env.state
                    time.sleep(0.2)
                assert env.state == "failed"
                assert "could not be built" in (env.last_error or "")
