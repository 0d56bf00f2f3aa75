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

__all__ = ["Ingress", "NotRunning", "RelayTimeout", "RelayUnavailable", "StillStarting", "router", "serving_ingress"]
