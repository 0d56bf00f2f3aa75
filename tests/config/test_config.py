"""Typed configuration: TOML + environment overrides, errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adx.cli._components import load_component_config
from adx.config import ConfigError, UpConfig, load_model
from adx.errors import InvalidInputError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "adx.toml"
    path.write_text(text)
    return path


def test_defaults_without_file() -> None:
    cfg = load_model(UpConfig, "up", None, environ={})
    assert cfg.redis.appendfsync == "always"
    assert cfg.state_dir == Path(".adx")


def test_file_values_are_typed(tmp_path: Path) -> None:
    path = write(tmp_path, 'state_dir = "/var/lib/adx"\n[redis]\nport = 6390\nappendfsync = "everysec"\n')
    cfg = load_model(UpConfig, "up", path, environ={})
    assert cfg.state_dir == Path("/var/lib/adx")
    assert (cfg.redis.port, cfg.redis.appendfsync) == (6390, "everysec")


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("[redis]\nport = 70000\n", "redis.port", "less than or equal to 65535"),
        ('[redis]\nappendfsync = "sometimes"\n', "redis.appendfsync", "'always', 'everysec' or 'no'"),
        ("[redis]\nprot = 1\n", "redis.prot", "unknown key"),
        ('[postgres]\ndatabase = "drop table"\n', "postgres.database", "should match pattern"),
        ("[logging]\nlevel = 3\n", "logging.level", "Input should be"),
    ],
)
def test_invalid_value_names_the_key(tmp_path: Path, text: str, key: str, reason: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_model(UpConfig, "up", path, environ={})
    assert caught.value.field == key
    assert reason in str(caught.value)
    assert str(caught.value).startswith(f"{path}: {key}: ")
    assert isinstance(caught.value, InvalidInputError)


def test_broken_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_model(UpConfig, "up", write(tmp_path, "[redis\n"), environ={})
    with pytest.raises(ConfigError, match="file not found"):
        load_model(UpConfig, "up", tmp_path / "missing.toml", environ={})


def test_environment_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[redis]\nport = 6390\n")
    env = {"ADX_UP__REDIS__PORT": "6391", "ADX_UP__POSTGRES__FSYNC": "false", "ADX_OTHER__X": "1"}
    cfg = load_model(UpConfig, "up", path, environ=env)
    assert cfg.redis.port == 6391
    assert cfg.postgres.fsync is False


def test_environment_override_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        load_model(UpConfig, "up", None, environ={"ADX_UP__REDIS__PORT": "lots"})
    assert caught.value.field == "redis.port"


def test_unknown_component() -> None:
    with pytest.raises(ConfigError, match="unknown component 'nope'"):
        load_component_config("nope", None)


@given(st.integers())
def test_port_is_accepted_exactly_in_range(port: int) -> None:
    env = {"ADX_UP__REDIS__PORT": str(port)}
    if 0 <= port <= 65535:
        assert load_model(UpConfig, "up", None, environ=env).redis.port == port
    else:
        with pytest.raises(ConfigError):
            load_model(UpConfig, "up", None, environ=env)


def test_every_component_resolves_to_a_strict_model() -> None:
    from adx.cli._components import COMPONENTS, component_model
    from adx.config import StrictModel

    for component in COMPONENTS:
        assert issubclass(component_model(component), StrictModel), component


def test_reading_configuration_does_not_import_the_components() -> None:
    import subprocess
    import sys

    heavy = "('adx.agents', 'adx.sandboxd', 'adx.api')"
    code = f"import sys, adx.config; print(sorted(m for m in sys.modules if m.startswith({heavy})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
