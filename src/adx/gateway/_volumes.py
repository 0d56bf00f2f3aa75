"""Volumes as every front door uses them (``/v1/volumes``, E2B's ``/volumes``, creates that mount volumes): the
store of the configured ``volumes_dir``, the check that a create names existing volumes, and a delete that
refuses a volume an Environment still mounts."""

from __future__ import annotations

import asyncio

from adx.errors import ConflictError, InvalidInputError, UnavailableError
from adx.gateway._context import Plane
from adx.model import TERMINAL_STATES, EnvironmentRecord, EnvironmentSpec, EnvironmentState, Volume
from adx.volumes import VolumeStore

__all__ = ["check_volume_mounts", "delete_volume", "volume_store"]


def volume_store(p: Plane) -> VolumeStore:
    root = p.config.volumes_dir
    if root is None:
        raise UnavailableError("this API server has no volumes_dir configured: volumes are not available")
    return VolumeStore(root)


async def check_volume_mounts(p: Plane, tenant: str, spec: EnvironmentSpec, field: str = "volumes") -> None:
    """Refuse a create that mounts a volume the tenant does not have (naming ``field[i].name``)."""
    if not spec.volumes:
        return
    store = volume_store(p)
    for i, mount in enumerate(spec.volumes):
        if await asyncio.to_thread(store.find, tenant, mount.name) is None:
            raise InvalidInputError(
                f"{field}[{i}].name", f"no volume named {mount.name!r}", details={"volume": mount.name}
            )


def _may_mount(record: EnvironmentRecord) -> bool:
    """Whether the Environment has its volumes mounted or may mount them again: every state but deleted, and
    failed without a pending restart (a final failure never starts again)."""
    if record.state in TERMINAL_STATES:
        return False
    return record.state is not EnvironmentState.FAILED or record.restart_pending


async def delete_volume(p: Plane, tenant: str, volume_id: str) -> Volume:
    """Delete the volume unless an Environment mounts it or may mount it again (409 naming them): a paused one
    mounts it again at its resume. A create racing the delete fails at its start (its volume is gone)."""
    store = volume_store(p)
    volume = await asyncio.to_thread(store.get, tenant, volume_id)
    users = [
        r.id
        for r in await p.coordinator.list_environments(tenant)
        if _may_mount(r) and any(m.name == volume.name for m in r.spec.volumes)
    ]
    if users:
        raise ConflictError(
            f"volume {volume.name!r} is mounted by {', '.join(sorted(users)[:5])}: delete those first",
            details={"volume_id": volume_id, "environments": sorted(users)},
        )
    return await asyncio.to_thread(store.delete, tenant, volume_id)
