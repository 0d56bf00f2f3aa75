"""``adx certs``: the cluster CA and per-component certificates for mutual TLS."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from adx._certs import KINDS, Identity, init_ca, issue
from adx.cli._app import GlobalOptions, app, console
from adx.cli._cluster import find_cluster
from adx.cli._output import failing
from adx.errors import InvalidInputError

certs_app = typer.Typer(help="Create the cluster CA and component certificates (mutual TLS).", no_args_is_help=True)
app.add_typer(certs_app, name="certs")

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        help="certificate directory (default: the recorded `adx up` cluster's, else .adx/certs)",
        file_okay=False,
    ),
]


def _directory(given: Path | None) -> Path:
    if given is not None:
        return given
    cluster = find_cluster(GlobalOptions.cluster)
    return cluster.certs_dir if cluster is not None else Path(".adx/certs")


@certs_app.command("init")
def init(directory: DirOption = None, cluster: str = "adx") -> None:
    """Create the cluster CA (kept if it already exists)."""
    with failing():
        directory = _directory(directory)
        created = init_ca(directory, cluster=cluster)
    console.print(f"{'created' if created else 'kept existing'} CA in {directory}", soft_wrap=True)


@certs_app.command("issue")
def issue_cmd(
    name: Annotated[str, typer.Argument(help="component name, e.g. the node name")],
    kind: Annotated[str, typer.Option("--kind", help=f"one of {', '.join(KINDS)}")] = "node",
    host: Annotated[list[str] | None, typer.Option("--host", help="DNS name or IP the cert is valid for")] = None,
    directory: DirOption = None,
) -> None:
    """Issue a key and certificate for a node, the Coordinator or the API server."""
    with failing():
        directory = _directory(directory)
        if kind not in KINDS:
            raise InvalidInputError("--kind", f"must be one of {', '.join(KINDS)}")
        identity = Identity.parse(f"{kind}:{name}")
        paths = issue(directory, identity, host)
    console.print(f"issued {identity.common_name}: {paths.cert} (key {paths.key})", soft_wrap=True)
