"""`adx up`'s default image is the Debian one (issue 13), and what `adx up` shows of its first-start build: the
steps and a failure, read from sandboxd's log lines as sandboxd's own log formatter writes them."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest
from typer.testing import CliRunner

from adx.cli import _up
from adx.cli._app import app
from adx.cli._up import _shorten, base_image_build_state
from adx.config import BaseImageName, UpConfig, load_model
from adx.logs import configure_logging
from adx.sandboxd import SandboxdConfig


def test_adx_ups_default_base_image_is_debian_and_host_is_a_choice() -> None:
    assert UpConfig().base_image == "debian"
    assert load_model(UpConfig, "up", None, environ={}).base_image == "debian"
    assert load_model(UpConfig, "up", None, environ={"ADX_UP__BASE_IMAGE": "host"}).base_image == "host"


def test_base_image_flag_overrides_the_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``adx up --base-image host`` (``./scripts/up --base-image host``) wins over the config and the default;
    the cluster's start itself is not under test here, so it only records the configuration it gets."""
    choices = set(get_args(BaseImageName))  # the flag's, adx up's and sandboxd's: one declaration
    assert choices == set(get_args(UpConfig.model_fields["base_image"].annotation)) == {"host", "debian"}
    assert choices == set(get_args(SandboxdConfig.model_fields["base_image"].annotation))
    got: list[UpConfig] = []

    async def record(cfg: UpConfig) -> None:
        got.append(cfg)

    monkeypatch.setattr(_up, "_run", record)
    root = logging.getLogger()  # `up` sets up logging: restored after
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.delenv("ADX_UP__BASE_IMAGE", raising=False)
    config = tmp_path / "up.toml"
    config.write_text('base_image = "debian"\n')
    runner = CliRunner()
    assert runner.invoke(app, ["up", "--state-dir", str(tmp_path / "s")]).exit_code == 0
    assert runner.invoke(app, ["up", "--config", str(config), "--base-image", "host"]).exit_code == 0
    assert [cfg.base_image for cfg in got] == ["debian", "host"]
    refused = runner.invoke(app, ["up", "--base-image", "ubuntu"])
    assert refused.exit_code == 2 and "--base-image" in refused.output


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


def test_a_status_line_is_never_longer_than_its_width() -> None:
    hook = "[   84s] I: running --customize-hook in shell: sh -c 'rm -rf \"$1\"/var/cache/apt/archives/*.deb' " * 3
    assert len(_shorten(hook)) == 90 and _shorten(hook).endswith("...")
    assert _shorten("[   24s] I: installing remaining packages inside the chroot...") == (
        "[   24s] I: installing remaining packages inside the chroot..."
    )
