"""``adx volume create|ls|rm``: the tenant's named volumes (docs/volumes.md); ``adx env create --volume
NAME=/PATH`` mounts one."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from adx.cli._app import app, console, fail
from adx.cli._env_cmd import ApiKey, ApiUrl, Json, _client
from adx.cli._human import format_time, table
from adx.errors import AdxError, NotFoundError

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
    try:
        with _client(api_url, api_key) as client:
            volume = client.volumes.create(name)
    except AdxError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(volume.to_wire()) + "\n")
        return
    console.print(f"{volume.id}  {volume.name}", highlight=False)


@volume_app.command("ls")
def list_volumes(as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """The tenant's volumes, oldest first."""
    try:
        with _client(api_url, api_key) as client:
            volumes = client.volumes.list()
    except AdxError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps({"volumes": [v.to_wire() for v in volumes]}) + "\n")
        return
    if not volumes:
        console.print("no volumes", highlight=False)
        return
    rows = [(v.id, v.name, format_time(v.created_at)) for v in volumes]
    console.print(table(("ID", "NAME", "CREATED"), rows), highlight=False)


@volume_app.command("rm")
def remove(volume: VolumeRef, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Delete a volume and its files (refused while an Environment mounts it)."""
    try:
        with _client(api_url, api_key) as client:
            if not volume.startswith("vol-"):
                found = [v for v in client.volumes.list() if v.name == volume]
                if not found:
                    raise NotFoundError(f"no volume named {volume!r}")
                volume = found[0].id
            deleted = client.volumes.delete(volume)
    except AdxError as exc:
        fail(exc)
    console.print(f"deleted {deleted.id} ({deleted.name})", highlight=False)
