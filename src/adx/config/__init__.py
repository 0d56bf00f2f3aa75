"""Typed configuration for every ADX component, loaded from TOML with environment overrides.

Environment overrides: ``ADX_<COMPONENT>__<KEY>[__<SUBKEY>...]=<value>``; values are parsed as JSON when
they parse, otherwise taken as strings (``ADX_UP__REDIS__APPENDFSYNC=everysec``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from adx.config._base import ConfigError, LoggingConfig, StrictModel, load_model
from adx.config._coordinator import CoordinatorConfig
from adx.config._embedded import PostgresServerConfig, RedisServerConfig, UpConfig
from adx.config._node import NodeConfig

if TYPE_CHECKING:
    from adx.api._config import ApiConfig
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
    "component_model",
    "load_component_config",
    "load_model",
]

#: Component name (as on the command line) -> "module:Model" of its configuration. Models that live in their
#: component's package are imported only when asked for: configuration must not drag every component
#: (e.g. the agents runtime) into each process that reads a config file.
COMPONENTS: dict[str, str] = {
    "up": "adx.config._embedded:UpConfig",
    "agent-worker": "adx.agents._config:AgentWorkerConfig",
    "coordinator": "adx.config._coordinator:CoordinatorConfig",
    "api": "adx.api._config:ApiConfig",
    "node": "adx.config._node:NodeConfig",
    "execd": "adx.execd._config:ExecdConfig",
    "sandboxd": "adx.sandboxd._config:SandboxdConfig",
}

_LAZY_EXPORTS = {"ApiConfig": "api", "SandboxdConfig": "sandboxd"}


def component_model(component: str) -> type[BaseModel]:
    try:
        module, _, name = COMPONENTS[component].partition(":")
    except KeyError:
        known = ", ".join(sorted(COMPONENTS))
        raise ConfigError("--component", "component", f"unknown component {component!r} (known: {known})") from None
    model: type[BaseModel] = getattr(importlib.import_module(module), name)
    return model


def load_component_config(component: str, path: Path | None, environ: Mapping[str, str] | None = None) -> BaseModel:
    return load_model(component_model(component), component, path, environ)


def __getattr__(name: str) -> Any:
    if name in _LAZY_EXPORTS:
        return component_model(_LAZY_EXPORTS[name])
    raise AttributeError(f"module 'adx.config' has no attribute {name!r}")
