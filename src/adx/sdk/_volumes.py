"""``client.volumes``: the tenant's named volumes (docs/volumes.md), sync and async::

data = client.volumes.create("data")
env = client.environments.create(volumes={"/mnt/data": data})   # or {"/mnt/data": "data"}
client.volumes.delete(data)      # ConflictError while an Environment mounts it
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic

from adx.errors import InvalidInputError
from adx.model import Volume, VolumeList
from adx.sdk._calls import C, Call, Plan, json_of

if TYPE_CHECKING:
    from adx.sdk._async import AsyncClient  # noqa: F401 (the faces' base classes name it)
    from adx.sdk._client import Client  # noqa: F401

__all__ = ["AsyncVolumes", "Volumes", "volumes_body"]


def volumes_body(volumes: Mapping[str, str | Volume]) -> list[dict[str, str]]:
    """``{mount path: volume or its name}`` as the spec's ``volumes`` list."""
    if not isinstance(volumes, Mapping):
        raise InvalidInputError("volumes", "must be a mapping of mount path to a volume (or its name)")
    return [{"name": v.name if isinstance(v, Volume) else v, "path": path} for path, v in volumes.items()]


def _id(volume: str | Volume) -> str:
    return volume.id if isinstance(volume, Volume) else volume


class _VolumesCore(Generic[C]):
    """Both faces' requests and answers (``adx.sdk._calls`` plans); each face carries them out."""

    def __init__(self, client: C) -> None:
        self._client = client

    def _one(self, method: str, path: str, what: str, *, idempotent: bool = True, json: Any = None) -> Plan[Volume]:
        call = Call(method, path, what=what, idempotent=idempotent, json=json)
        return Volume.model_validate((yield from json_of(self._client, call)))

    def _create(self, name: str) -> Plan[Volume]:
        return self._one("POST", "/v1/volumes", f"create volume {name}", idempotent=False, json={"name": name})

    def _list(self) -> Plan[list[Volume]]:
        call = Call("GET", "/v1/volumes", what="list volumes", idempotent=True)
        return VolumeList.model_validate((yield from json_of(self._client, call))).volumes

    def _get(self, volume: str | Volume) -> Plan[Volume]:
        return self._one("GET", f"/v1/volumes/{_id(volume)}", f"get {_id(volume)}")

    def _delete(self, volume: str | Volume) -> Plan[Volume]:
        return self._one("DELETE", f"/v1/volumes/{_id(volume)}", f"delete {_id(volume)}")


class Volumes(_VolumesCore["Client"]):
    """The tenant's volumes (``client.volumes``)."""

    def create(self, name: str) -> Volume:
        """A new, empty volume (ConflictError when the tenant has one of that name)."""
        return self._client.run(self._create(name))

    def list(self) -> list[Volume]:
        return self._client.run(self._list())

    def get(self, volume: str | Volume) -> Volume:
        return self._client.run(self._get(volume))

    def delete(self, volume: str | Volume) -> Volume:
        """Delete the volume and its files (ConflictError while an Environment mounts it)."""
        return self._client.run(self._delete(volume))


class AsyncVolumes(_VolumesCore["AsyncClient"]):
    """``Volumes`` for the AsyncClient."""

    async def create(self, name: str) -> Volume:
        return await self._client.run(self._create(name))

    async def list(self) -> list[Volume]:
        return await self._client.run(self._list())

    async def get(self, volume: str | Volume) -> Volume:
        return await self._client.run(self._get(volume))

    async def delete(self, volume: str | Volume) -> Volume:
        return await self._client.run(self._delete(volume))
