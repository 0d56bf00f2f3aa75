"""``adx certs``: the cluster CA and per-component certificates for mutual TLS."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from adx._certs import KINDS, Identity, init_ca, issue
from adx.cli._app import app, console, fail
from adx.errors import AdxError, InvalidInputError

certs_app = typer.Typer(help="Create the cluster CA and component certificates (mutual TLS).", no_args_is_help=True)
app.add_typer(certs_app, name="certs")

DirOption = Annotated[Path, typer.Option("--dir", help="certificate directory", file_okay=False)]


@certs_app.command("init")
def init(directory: DirOption = Path(".adx/certs"), cluster: str = "adx") -> None:
    """Create the cluster CA (kept if it already exists)."""
    try:
        created = init_ca(directory, cluster=cluster)
    except AdxError as exc:
        fail(exc)
    console.print(f"{'created' if created else 'kept existing'} CA in {directory}", soft_wrap=True)


@certs_app.command("issue")
def issue_cmd(
    name: Annotated[str, typer.Argument(help="component name, e.g. the node name")],
    kind: Annotated[str, typer.Option("--kind", help=f"one of {', '.join(KINDS)}")] = "node",
    host: Annotated[list[str] | None, typer.Option("--host", help="DNS name or IP the cert is valid for")] = None,
    directory: DirOption = Path(".adx/certs"),
) -> None:
    """Issue a key and certificate for a node, the Coordinator or the API server."""
    try:
        if kind not in KINDS:
            raise InvalidInputError("--kind", f"must be one of {', '.join(KINDS)}")
        identity = Identity.parse(f"{kind}:{name}")
        paths = issue(directory, identity, host)
    except AdxError as exc:
        fail(exc)
    console.print(f"issued {identity.common_name}: {paths.cert} (key {paths.key})", soft_wrap=True)
