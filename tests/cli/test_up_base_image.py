"""`adx up`'s default image is the Debian one (issue 13), and what `adx up` shows of its first-start build: the
steps and a failure, read from sandboxd's log lines as sandboxd's own log formatter writes them."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from adx.cli._up import base_image_build_state
from adx.config import UpConfig, load_model
from adx.logs import configure_logging


def test_adx_ups_default_base_image_is_debian_and_host_is_a_choice() -> None:
    assert UpConfig().base_image == "debian"
    assert load_model(UpConfig, "up", None, environ={}).base_image == "debian"
    assert load_model(UpConfig, "up", None, environ={"ADX_UP__BASE_IMAGE": "host"}).base_image == "host"


@pytest.fixture
def sandboxd_log() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging("sandboxd", "info", "kv", stream=stream)
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)


def test_the_build_state_is_the_latest_step_or_the_failure(sandboxd_log: io.StringIO) -> None:
    images = logging.getLogger("adx.sandboxd.images")
    assert base_image_build_state(sandboxd_log.getvalue()) == (None, None)
    images.info("base image: %s", "[    4s] I: downloading packages with apt...")
    images.info("base image: %s", '[   84s] I: running --customize-hook in shell: sh -c \'echo "x" > "$1/y"\'')
    step, error = base_image_build_state(sandboxd_log.getvalue())
    assert step == '[   84s] I: running --customize-hook in shell: sh -c \'echo "x" > "$1/y"\''
    assert error is None
    images.error("the Debian base image could not be built: %s", 'mmdebstrap failed (1):\nE: "bookworm" not found')
    step, error = base_image_build_state(sandboxd_log.getvalue())
    assert error == 'the Debian base image could not be built: mmdebstrap failed (1): E: "bookworm" not found'
