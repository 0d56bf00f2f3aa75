"""How an admin command (``adx tenant ...``) reaches the Coordinator: as an API server does, with the ``api``
certificate, at the address of the recorded cluster unless a flag, ``--config`` or ``ADX_API__*`` says
otherwise. Every error names the real fix: which cluster was used, which file is missing, what to run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from adx.cli._app import GlobalOptions
from adx.cli._cluster import NO_CLUSTER_FIX, ClusterInfo, find_cluster
from adx.errors import NotFoundError

if TYPE_CHECKING:
    from adx.gateway import ApiConfig


@dataclass(frozen=True)
class AdminTarget:
    api: ApiConfig
    cluster: ClusterInfo | None  # the recorded cluster, when it supplied the address or the certificates

    @property
    def reach_fix(self) -> str:
        if self.cluster is not None:
            return f"is `adx up --state-dir {self.cluster.state_dir}` running? ({self.cluster.where})"
        return "check --coordinator (or ADX_API__COORDINATOR), or " + NO_CLUSTER_FIX


def admin_config(coordinator: str | None, certs_dir: Path | None, config: Path | None) -> AdminTarget:
    from adx._certs import Identity, component_paths
    from adx.config import load_model
    from adx.gateway import ApiConfig

    cfg = load_model(ApiConfig, "api", config)
    update: dict[str, object] = {}
    cluster = None
    missing = {"coordinator", "certs_dir"} - cfg.model_fields_set - ({"coordinator"} if coordinator else set())
    missing -= {"certs_dir"} if certs_dir else set()
    if missing:
        cluster = find_cluster(GlobalOptions.cluster)
        if cluster is not None:
            if "coordinator" in missing:
                update["coordinator"] = cluster.coordinator
            if "certs_dir" in missing:
                update["certs_dir"] = cluster.certs_dir
    if coordinator is not None:
        update["coordinator"] = coordinator
    if certs_dir is not None:
        update["certs_dir"] = certs_dir
    if update:
        cfg = ApiConfig.model_validate({**cfg.model_dump(), **update})
    paths = component_paths(cfg.certs_dir, Identity("api", cfg.name))
    absent = [path for path in (paths.ca, paths.cert, paths.key) if not path.exists()]
    if absent:
        if cluster is not None and "certs_dir" in update and certs_dir is None:
            fix = (
                f"the certificate directory of {cluster.where} is gone: start `adx up --state-dir "
                f"{cluster.state_dir}` again, or pass --certs-dir"
            )
        elif missing and cluster is None and certs_dir is None:
            fix = f"no cluster is recorded: {NO_CLUSTER_FIX}; or pass --coordinator HOST:PORT and --certs-dir DIR"
        else:
            fix = (
                f"pass the --certs-dir of your cluster (an `adx up` cluster keeps them in STATE_DIR/certs), or "
                f"issue one with `adx certs issue {cfg.name} --kind api --dir {cfg.certs_dir}`"
            )
        raise NotFoundError(f"TLS file {absent[0]} not found: {fix}")
    return AdminTarget(cfg, cluster if "coordinator" in update and coordinator is None else None)
