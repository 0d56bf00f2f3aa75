"""Snapshots in Redis: each write one fenced Lua script, the snapshot's artifact in CRD-9's checkpoint catalog.

Keys: ``adx:snap:<id>`` (a hash: doc, tenant, name), the tenant's index ``adx:snaps:<tenant>`` (a sorted set by
creation time), ``adx:snaps-expiry`` (by expiry, for the sweep) and ``adx:snap-ckpts`` (the artifacts snapshots
hold: part of the global reference list a returning node's sweep keeps, CRD-9).

The artifact's catalog entry (``adx:ckpt:<id>``) is in state ``snapshot``: the catalog retires only ``live``
entries when an Environment's reference moves, so neither the source's later pause or delete nor the first start
of an Environment made from the snapshot retires it. Deleting the snapshot (or its expiry) retires it in the same
script: the nodes delete the artifact and confirm (ConfirmCheckpointDeleted), as for any retired checkpoint.
"""

from __future__ import annotations

import time

from adx.coordinator._keys import (
    RETIRED_CHECKPOINTS,
    SNAPSHOT_CHECKPOINTS,
    SNAPSHOT_EXPIRY,
    checkpoint_key,
    snapshot_key,
    tenant_snapshots_key,
)
from adx.coordinator._redis_store import _text
from adx.coordinator._scripts import fenced
from adx.coordinator._store import CoordinatorStore
from adx.errors import NotFoundError
from adx.model import Snapshot

# KEYS: snapshot, tenant index, expiry index, snapshot checkpoints, checkpoint
# ARGV: id, doc, tenant, name, created_at, expires_at ('' = never), checkpoint id, checkpoint doc, source env
PUT_SNAPSHOT = fenced(
    """
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'tenant', ARGV[3], 'name', ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
if ARGV[6] ~= '' then redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1]) end
redis.call('SADD', KEYS[4], ARGV[7])
redis.call('HSET', KEYS[5], 'doc', ARGV[8], 'env', ARGV[9], 'state', 'snapshot')
return {1, ''}
"""
)

# KEYS: snapshot, tenant index, expiry index, snapshot checkpoints, checkpoint, retired checkpoints
# ARGV: id, tenant ('' = any: the expiry sweep), checkpoint id, now
DROP_SNAPSHOT = fenced(
    """
local tenant = redis.call('HGET', KEYS[1], 'tenant')
if not tenant or (ARGV[2] ~= '' and tenant ~= ARGV[2]) then return {-1, 'unknown snapshot'} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[3])
if redis.call('HGET', KEYS[5], 'state') == 'snapshot' then
  redis.call('HSET', KEYS[5], 'state', 'retired', 'retired_at', ARGV[4])
  redis.call('SADD', KEYS[6], ARGV[3])
end
return {1, ''}
"""
)


class SnapshotStore:
    def __init__(self, store: CoordinatorStore) -> None:
        self._store = store
        self._redis = store._redis
        self._put = self._redis.register_script(PUT_SNAPSHOT)
        self._drop = self._redis.register_script(DROP_SNAPSHOT)

    async def put(self, snapshot: Snapshot) -> None:
        ckpt = snapshot.checkpoint
        await self._store._script(
            "store snapshot",
            self._put,
            [
                snapshot_key(snapshot.id),
                tenant_snapshots_key(snapshot.tenant),
                SNAPSHOT_EXPIRY,
                SNAPSHOT_CHECKPOINTS,
                checkpoint_key(ckpt.id),
            ],
            [
                snapshot.id,
                snapshot.model_dump_json(by_alias=True),
                snapshot.tenant,
                snapshot.name or "",
                repr(snapshot.created_at),
                "" if snapshot.expires_at is None else repr(snapshot.expires_at),
                ckpt.id,
                ckpt.model_dump_json(by_alias=True),
                snapshot.source_environment_id,
            ],
        )

    async def get(self, snapshot_id: str) -> Snapshot | None:
        doc = await self._store._call(
            "get snapshot", lambda: self._redis.hget(snapshot_key(snapshot_id), "doc"), writes=False
        )
        return None if doc is None else Snapshot.model_validate_json(doc)

    async def of_tenant(self, tenant: str) -> list[Snapshot]:
        """The tenant's snapshots, oldest first."""

        async def fetch() -> list[Snapshot]:
            ids = [_text(raw) for raw in await self._redis.zrange(tenant_snapshots_key(tenant), 0, -1)]
            found = []
            for snapshot_id in ids:
                doc = await self._redis.hget(snapshot_key(snapshot_id), "doc")
                if doc is not None:
                    found.append(Snapshot.model_validate_json(doc))
            return found

        return await self._store._call("list snapshots", fetch, writes=False)

    async def drop(self, snapshot: Snapshot, *, tenant: str | None) -> None:
        """Delete the snapshot and retire its artifact; NotFoundError if it is gone (or another tenant's)."""
        status, _ = await self._store._script(
            "delete snapshot",
            self._drop,
            [
                snapshot_key(snapshot.id),
                tenant_snapshots_key(snapshot.tenant),
                SNAPSHOT_EXPIRY,
                SNAPSHOT_CHECKPOINTS,
                checkpoint_key(snapshot.checkpoint.id),
                RETIRED_CHECKPOINTS,
            ],
            [snapshot.id, tenant or "", snapshot.checkpoint.id, repr(time.time())],
        )
        if status != 1:
            raise NotFoundError(f"snapshot {snapshot.id} not found")

    async def expired(self, now: float) -> list[str]:
        raw = await self._store._call(
            "expired snapshots", lambda: self._redis.zrangebyscore(SNAPSHOT_EXPIRY, "-inf", now), writes=False
        )
        return [_text(r) for r in raw]
