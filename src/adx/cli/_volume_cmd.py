"""``adx volume create|ls|rm``: the tenant's named volumes (docs/volumes.md); ``adx env create --volume
NAME=/PATH`` mounts one."""

from __future__ import annotations

from typing import Annotated

import typer

from adx.cli._api_client import ApiKey, ApiUrl, api_client, with_api
from adx.cli._app import app, console
from adx.cli._human import format_time
from adx.cli._output import Json, failing, print_json, print_listing
from adx.errors import NotFoundError

volume_app = typer.Typer(help="Named volumes: create, list, remove.", no_args_is_help=True)
app.add_typer(volume_app, name="volume")

VolumeRef = Annotated[str, typer.Argument(help="the volume's name or ID (vol-...)")]


@volume_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="1-63 letters, digits, '_' or '-'")],
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Create an empty volume."""
    volume = with_api(api_url, api_key, lambda client: client.volumes.create(name))
    if as_json:
        print_json(volume.to_wire())
        return
    console.print(f"{volume.id}  {volume.name}", highlight=False)


@volume_app.command("ls")
def list_volumes(as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """The tenant's volumes, oldest first."""
    print_listing(
        with_api(api_url, api_key, lambda client: client.volumes.list()),
        as_json,
        key="volumes",
        wire=lambda v: v.to_wire(),
        header=("ID", "NAME", "CREATED"),
        row=lambda v: (v.id, v.name, format_time(v.created_at)),
        empty="no volumes",
    )


@volume_app.command("rm")
def remove(volume: VolumeRef, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Delete a volume and its files (refused while an Environment mounts it)."""
    with failing(), api_client(api_url, api_key) as client:
        if not volume.startswith("vol-"):
            found = [v for v in client.volumes.list() if v.name == volume]
            if not found:
                raise NotFoundError(f"no volume named {volume!r}")
            volume = found[0].id
        deleted = client.volumes.delete(volume)
    console.print(f"deleted {deleted.id} ({deleted.name})", highlight=False)
