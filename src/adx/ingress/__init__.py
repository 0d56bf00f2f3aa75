"""The Ingress: the data plane's edge (commands, files, ports), mounted in ``adx api`` or run as ``adx ingress``."""

from adx.ingress._ingress import (
    Ingress,
    NotRunning,
    RelayTimeout,
    RelayUnavailable,
    StillStarting,
    serving_ingress,
)
from adx.ingress._routes import router
from adx.ingress._tokens import TokenCache, TokenClient

__all__ = [
    "Ingress",
    "NotRunning",
    "RelayTimeout",
    "RelayUnavailable",
    "StillStarting",
    "TokenCache",
    "TokenClient",
    "router",
    "serving_ingress",
]
