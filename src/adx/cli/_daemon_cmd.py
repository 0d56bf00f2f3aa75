"""How a daemon command starts (``adx api``, ``ingress``, ``coordinator``, ``node --config``, ``sandboxd``,
``agent worker``, ``agent maintenance``): its configuration loaded (and, for the cluster's daemons, the
recorded ``adx up`` cluster's addresses where the file and environment are silent), logging set up from it,
then the daemon run; an error of either step ends the command with its message and exit status."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from adx.cli._app import GlobalOptions, setup_logging
from adx.cli._cluster import ClusterInfo, fill_from_cluster, log_joined
from adx.cli._output import failing
from adx.config import LoggingConfig, load_model

if TYPE_CHECKING:
    from pydantic import BaseModel

C = TypeVar("C", bound="BaseModel")
T = TypeVar("T")

#: A config field a daemon takes from the recorded cluster -> how the cluster's record gives it.
FromCluster = Mapping[str, Callable[[ClusterInfo], object]]

#: What a hand-started API server, Ingress or node takes from the recorded cluster when its config is silent
#: (a node's own certificate: `adx certs issue NAME`, which writes into the same directory).
COORDINATOR_CLIENT: FromCluster = {
    "coordinator": lambda c: c.coordinator,
    "certs_dir": lambda c: c.certs_dir,
}


def run_daemon(
    model: type[C],
    component: str,
    path: Path | None,
    run: Callable[[C], T],
    from_cluster: FromCluster | None = None,
) -> T:
    """Load ``component``'s config of ``model`` from ``path`` (filled ``from_cluster``), log as ``component``,
    and return ``run(config)``."""
    with failing():
        config = load_model(model, component, path)
        cluster = None
        if from_cluster is not None:
            config, cluster = fill_from_cluster(config, from_cluster, GlobalOptions.cluster)
    logs = getattr(config, "logging", None)  # every daemon's config has a [logging] table (adx.config)
    assert isinstance(logs, LoggingConfig), f"{model.__name__} has no logging table"
    setup_logging(component, logs.level, logs.format)
    log_joined(cluster)
    with failing():
        return run(config)
