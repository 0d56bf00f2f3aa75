"""Which configuration model each component reads: the registry behind ``adx config check``.

It lives with the CLI, not in ``adx.config``: each component package owns its configuration model and
``adx.config`` holds only the shared base, so the base never depends on the components that build on it.
Models are imported only when asked for, so checking one file does not load every component.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from adx.config import ConfigError, load_model

__all__ = ["COMPONENTS", "component_model", "load_component_config"]

#: Component name (as on the command line) -> "module:Model" of its configuration.
COMPONENTS: dict[str, str] = {
    "up": "adx.config._embedded:UpConfig",
    "agent-worker": "adx.agents._config:AgentWorkerConfig",
    "coordinator": "adx.config._coordinator:CoordinatorConfig",
    "api": "adx.gateway._config:ApiConfig",
    "node": "adx.config._node:NodeConfig",
    "execd": "adx.execd._config:ExecdConfig",
    "sandboxd": "adx.sandboxd._config:SandboxdConfig",
}


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
