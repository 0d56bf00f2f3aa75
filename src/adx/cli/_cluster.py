"""Where the cluster is: ``adx up`` records it, and every ``adx`` command reads it unless told otherwise.

``adx up`` writes ``cluster.json`` next to the SDK's credentials (``$XDG_CONFIG_HOME/adx/cluster.json``) and
into its state directory. A command uses, in this order: its own flags, its environment variables
(``ADX_API_URL``, ``ADX_API__COORDINATOR``...) or ``--config`` file, then the cluster chosen with
``adx --cluster STATE_DIR`` (or ``ADX_CLUSTER``), else the last cluster ``adx up`` started.

A daemon of a running ``adx up`` may come back on another port after a crash: the live address in the state
directory (``<kind>/server.json``, written by the supervisor) wins over the recorded one.

Standard library only: every client command reads this before anything else, and must start fast.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from adx.errors import InvalidInputError, NotFoundError

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")

ENV_CLUSTER = "ADX_CLUSTER"
FILE_NAME = "cluster.json"
NO_CLUSTER_FIX = "start one with `adx up` (it records where its cluster is), or name it with `adx --cluster STATE_DIR`"


def user_cluster_file(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/adx/cluster.json`` (default ``~/.config/adx/cluster.json``), beside the credentials."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "adx" / FILE_NAME


@dataclass(frozen=True)
class ClusterInfo:
    """One ``adx up`` cluster: how to reach its API and Coordinator, and where its certificates are."""

    api_url: str
    coordinator: str  # host:port of the Coordinator's gRPC service (mutual TLS, certificates in certs_dir)
    certs_dir: Path
    state_dir: Path
    redis_url: str
    tenant: str  # the tenant whose key `adx up` keeps in state_dir/credentials.json
    source: Path | None = None  # the file this was read from

    def to_json(self) -> dict[str, str]:
        return {
            "api_url": self.api_url,
            "coordinator": self.coordinator,
            "certs_dir": str(self.certs_dir),
            "state_dir": str(self.state_dir),
            "redis_url": self.redis_url,
            "tenant": self.tenant,
        }

    @property
    def where(self) -> str:
        """How a message names this cluster, so the user can tell which one a command talked to."""
        return f"the cluster of `adx up --state-dir {self.state_dir}` (recorded in {self.source})"

    def api_key(self) -> str | None:
        """The key `adx up` made for its tenant (``state_dir/credentials.json``, 0600), if this user can read it."""
        try:
            data = json.loads((self.state_dir / "credentials.json").read_text())
        except (OSError, ValueError):
            return None
        key = data.get("api_key") if isinstance(data, dict) else None
        return key if isinstance(key, str) and key else None


def write_cluster(info: ClusterInfo, environ: Mapping[str, str] | None = None) -> list[Path]:
    """Record ``info`` in the state directory and beside the user's credentials (each write atomic)."""
    from adx._fs import atomic_write_json

    written = []
    user_file = user_cluster_file(environ)
    user_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for path in (info.state_dir / FILE_NAME, user_file):
        atomic_write_json(path, info.to_json(), mode=0o600)
        written.append(path)
    return written


def _live_port(state_dir: Path, kind: str) -> int | None:
    """The port a running daemon of this state directory listens on now, if it recorded one."""
    try:
        data = json.loads((state_dir / kind / "server.json").read_text())
    except (OSError, ValueError):
        return None
    port = data.get("port") if isinstance(data, dict) else None
    return port if isinstance(port, int) and port > 0 else None


def _with_port(address: str, port: int) -> str:
    host, _, _ = address.rpartition(":")
    return f"{host}:{port}"


def _parse(path: Path, data: object) -> ClusterInfo:
    fields = ("api_url", "coordinator", "certs_dir", "state_dir", "redis_url", "tenant")
    if not isinstance(data, dict) or not all(isinstance(data.get(name), str) for name in fields):
        raise InvalidInputError(
            str(path), f"is not a cluster file (it needs {', '.join(fields)}); delete it and run `adx up` again"
        )
    state_dir = Path(data["state_dir"])
    api_url, coordinator = data["api_url"], data["coordinator"]
    # A crashed daemon may have been restarted on another port: the live record wins.
    if (port := _live_port(state_dir, "api")) is not None:
        scheme, _, rest = api_url.partition("://")
        api_url = f"{scheme}://{_with_port(rest, port)}"
    if (port := _live_port(state_dir, "coordinator")) is not None:
        coordinator = _with_port(coordinator, port)
    return ClusterInfo(
        api_url=api_url,
        coordinator=coordinator,
        certs_dir=Path(data["certs_dir"]),
        state_dir=state_dir,
        redis_url=data["redis_url"],
        tenant=data["tenant"],
        source=path,
    )


def find_cluster(selector: str | None = None, environ: Mapping[str, str] | None = None) -> ClusterInfo | None:
    """The cluster named by ``selector`` (a state directory or a cluster file; default ``$ADX_CLUSTER``), else
    the one ``adx up`` recorded for this user; None when there is none. A named cluster that is not there is
    an error (the user asked for it)."""
    env = os.environ if environ is None else environ
    chosen = selector or env.get(ENV_CLUSTER) or None
    if chosen is not None:
        given = Path(chosen).expanduser()
        path = given / FILE_NAME if given.is_dir() or not given.suffix else given
        if not path.is_file():
            raise NotFoundError(
                f"no cluster at {chosen}: {path} does not exist (start one with `adx up --state-dir {given}`, "
                f"or name another with --cluster / {ENV_CLUSTER})"
            )
    else:
        path = user_cluster_file(env)
        if not path.is_file():
            return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError(str(path), f"cannot be read as a cluster file ({exc}); run `adx up` again") from None
    return _parse(path.absolute(), data)


def fill_from_cluster(
    config: M, fields: Mapping[str, Callable[[ClusterInfo], object]], selector: str | None
) -> tuple[M, ClusterInfo | None]:
    """``config`` with each of ``fields`` its file and environment left unset taken from the recorded cluster
    (a daemon started by hand joins the ``adx up`` cluster); the cluster, when it supplied any."""
    missing = [name for name in fields if name not in config.model_fields_set]
    if not missing:
        return config, None
    cluster = find_cluster(selector)
    if cluster is None:
        return config, None
    values = {name: fields[name](cluster) for name in missing}
    return type(config).model_validate({**config.model_dump(), **values}), cluster


def log_joined(cluster: ClusterInfo | None) -> None:
    """One line saying a daemon took addresses from the recorded cluster (an operator must be able to tell)."""
    if cluster is not None:
        import logging

        logging.getLogger("adx.cli").info(
            "joining the recorded cluster", extra={"cluster": str(cluster.source), "state_dir": str(cluster.state_dir)}
        )
