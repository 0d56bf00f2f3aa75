"""Typed configuration for every ADX component, loaded from TOML with environment overrides.

Environment overrides: ``ADX_<COMPONENT>__<KEY>[__<SUBKEY>...]=<value>``; values are parsed as JSON when
they parse, otherwise taken as strings (``ADX_UP__REDIS__APPENDFSYNC=everysec``).

Components whose configuration lives in their own package (``adx.api``, ``adx.sandboxd``, ``adx.execd``,
``adx.agents``) build on the shared base here; this package never imports them (``adx.cli._components``
maps component names to models).
"""

from __future__ import annotations

from adx.config._base import ConfigError, LoggingConfig, StrictModel, load_model
from adx.config._coordinator import CoordinatorConfig
from adx.config._embedded import PostgresServerConfig, RedisServerConfig, UpConfig
from adx.config._fields import BaseImageName
from adx.config._node import NodeConfig

__all__ = [
    "BaseImageName",
    "ConfigError",
    "CoordinatorConfig",
    "LoggingConfig",
    "NodeConfig",
    "PostgresServerConfig",
    "RedisServerConfig",
    "StrictModel",
    "UpConfig",
    "load_model",
]
