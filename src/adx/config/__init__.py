"""Typed configuration for every ADX component, loaded from TOML with environment overrides.

Environment overrides: ``ADX_<COMPONENT>__<KEY>[__<SUBKEY>...]=<value>``; values are parsed as JSON when
they parse, otherwise taken as strings (``ADX_UP__REDIS__APPENDFSYNC=everysec``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from adx.agents._config import AgentWorkerConfig
from adx.api._config import ApiConfig
from adx.config._base import ConfigError, LoggingConfig, StrictModel, load_model
from adx.config._coordinator import CoordinatorConfig
from adx.config._embedded import PostgresServerConfig, RedisServerConfig, UpConfig
from adx.config._node import NodeConfig
from adx.execd._config import ExecdConfig
from adx.sandboxd._config import SandboxdConfig

__all__ = [
    "COMPONENTS",
    "ApiConfig",
    "ConfigError",
    "CoordinatorConfig",
    "LoggingConfig",
    "NodeConfig",
    "PostgresServerConfig",
    "RedisServerConfig",
    "SandboxdConfig",
    "StrictModel",
    "UpConfig",
    "load_component_config",
    "load_model",
]

#: Component name (as on the command line) -> its configuration model. Later components register here.
COMPONENTS: dict[str, type[BaseModel]] = {
    "up": UpConfig,
    "agent-worker": AgentWorkerConfig,
    "coordinator": CoordinatorConfig,
    "api": ApiConfig,
    "node": NodeConfig,
    "execd": ExecdConfig,
    "sandboxd": SandboxdConfig,
}


def load_component_config(component: str, path: Path | None, environ: Mapping[str, str] | None = None) -> BaseModel:
    try:
        model = COMPONENTS[component]
    except KeyError:
        known = ", ".join(sorted(COMPONENTS))
        raise ConfigError("--component", "component", f"unknown component {component!r} (known: {known})") from None
    return load_model(model, component, path, environ)
