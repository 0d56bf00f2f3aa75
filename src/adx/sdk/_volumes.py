"""``client.volumes``: the tenant's named volumes (docs/volumes.md), sync and async::

data = client.volumes.create("data")
env = client.environments.create(volumes={"/mnt/data": data})   # or {"/mnt/data": "data"}
client.volumes.delete(data)      # ConflictError while an Environment mounts it
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from adx.errors import InvalidInputError
from adx.model import Volume, VolumeList

if TYPE_CHECKING:
    from adx.sdk._async import AsyncClient
    from adx.sdk._client import Client

__all__ = ["AsyncVolumes", "Volumes", "volumes_body"]


def volumes_body(volumes: Mapping[str, str | Volume]) -> list[dict[str, str]]:
    """``{mount path: volume or its name}`` as the spec's ``volumes`` list."""
    if not isinstance(volumes, Mapping):
        raise InvalidInputError("volumes", "must be a mapping of mount path to a volume (or its name)")
    return [{"name": v.name if isinstance(v, Volume) else v, "path": path} for path, v in volumes.items()]


def _id(volume: str | Volume) -> str:
    return volume.id if isinstance(volume, Volume) else volume


class Volumes:
    """The tenant's volumes (``client.volumes``)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, name: str) -> Volume:
        """A new, empty volume (ConflictError when the tenant has one of that name)."""
        response = self._client.request(
            "POST", "/v1/volumes", what=f"create volume {name}", idempotent=False, json={"name": name}
        )
        return Volume.model_validate(response.json())

    def list(self) -> list[Volume]:
        response = self._client.request("GET", "/v1/volumes", what="list volumes", idempotent=True)
        return VolumeList.model_validate(response.json()).volumes

    def get(self, volume: str | Volume) -> Volume:
        volume_id = _id(volume)
        response = self._client.request("GET", f"/v1/volumes/{volume_id}", what=f"get {volume_id}", idempotent=True)
        return Volume.model_validate(response.json())

    def delete(self, volume: str | Volume) -> Volume:
        """Delete the volume and its files (ConflictError while an Environment mounts it)."""
        volume_id = _id(volume)
        response = self._client.request(
            "DELETE", f"/v1/volumes/{volume_id}", what=f"delete {volume_id}", idempotent=True
        )
        return Volume.model_validate(response.json())


class AsyncVolumes:
    """``Volumes`` for the AsyncClient."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, name: str) -> Volume:
        response = await self._client.request(
            "POST", "/v1/volumes", what=f"create volume {name}", idempotent=False, json={"name": name}
        )
        return Volume.model_validate(response.json())

    async def list(self) -> list[Volume]:
        response = await self._client.request("GET", "/v1/volumes", what="list volumes", idempotent=True)
        return VolumeList.model_validate(response.json()).volumes

    async def get(self, volume: str | Volume) -> Volume:
        volume_id = _id(volume)
        response = await self._client.request(
            "GET", f"/v1/volumes/{volume_id}", what=f"get {volume_id}", idempotent=True
        )
        return Volume.model_validate(response.json())

    async def delete(self, volume: str | Volume) -> Volume:
        volume_id = _id(volume)
        response = await self._client.request(
            "DELETE", f"/v1/volumes/{volume_id}", what=f"delete {volume_id}", idempotent=True
        )
        return Volume.model_validate(response.json())
