"""The Coordinator's store on Redis: the only authority for Environments, nodes, tenants and API keys.

This module holds Environments (create with its placement reservation, CAS commits, resume intents), tenants
and their API keys, the checkpoint catalog's reads and the route publications. The nodes are
``_node_store``'s; how every write reaches Redis (one fenced Lua script each, replica acknowledgement, errors
translated for CRD-2) is ``_redis_store``'s; the key layout is ``_keys``'s.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from adx.coordinator import _scripts
from adx.coordinator._keys import (
    RETIRED_CHECKPOINTS,
    ROUTES_CHANNEL,
    SNAPSHOT_CHECKPOINTS,
    TENANT_SET,
    api_key_key,
    checkpoint_key,
    env_key,
    idempotency_key,
    node_key,
    node_reservations_key,
    tenant_index_key,
    tenant_key,
    tenant_keys_key,
)
from adx.coordinator._node_store import NodeRegistry
from adx.coordinator._redis import redis_client
from adx.coordinator._redis_store import ScriptArg, _text
from adx.errors import (
    ConflictError,
    InvalidInputError,
    NoCapacityError,
    NotFoundError,
    SessionRejectedError,
    UnavailableError,
)
from adx.model import CheckpointRef, EnvironmentRecord, EnvironmentState
from adx.model._records import RecordChanges

API_KEY_PREFIX = "adxk_"
DELETED_RECORD_TTL_SECONDS = 24 * 3600
IDEMPOTENCY_TTL_SECONDS = 24 * 3600


def hash_api_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def new_api_key(prefix: str) -> tuple[str, str]:
    """A new secret (API key, admin key, endpoint token) starting with ``prefix``, and its hash: only the hash is
    stored (SEC-2, SEC-4); the secret is shown once."""
    secret = prefix + secrets.token_urlsafe(32)
    return secret, hash_api_key(secret)


#: The node's session is not the registered one: the node must re-register (NOD-6).
SessionRejected = SessionRejectedError


#: The node refused the reservation (capacity, expired sample, closed admission).
NoCapacity = NoCapacityError


@dataclass(frozen=True)
class CreateOutcome:
    record: EnvironmentRecord
    created: bool  # False: an earlier request with the same idempotency key created it


#: One publication on the route channel: a route (``_route``) or a revoked endpoint token, as JSON.
RouteMessage = dict[str, object]


def _route(record: EnvironmentRecord) -> str:
    return json.dumps(
        {
            "id": record.id,
            "tenant": record.tenant,
            "node": record.node,
            "state": record.state.value,
            "revision": record.revision,
            "generation": record.generation,
        },
        separators=(",", ":"),
    )


class CoordinatorStore(NodeRegistry):
    """Environments, tenants and API keys, the checkpoint catalog and route publications; nodes are
    :class:`NodeRegistry`'s, the Redis access (fencing, WAIT, errors) :class:`RedisStore`'s."""

    def __init__(self, client: aioredis.Redis, *, wait_replicas: int = 0, wait_timeout: float = 1.0) -> None:
        super().__init__(client, wait_replicas=wait_replicas, wait_timeout=wait_timeout)
        self._create_tenant = client.register_script(_scripts.CREATE_TENANT)
        self._create_env = client.register_script(_scripts.CREATE_ENV)
        self._commit_env = client.register_script(_scripts.COMMIT_ENV)
        self._resume_env = client.register_script(_scripts.RESUME_ENV)
        self._forget_checkpoint = client.register_script(_scripts.FORGET_CHECKPOINT)

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 5.0, wait_replicas: int = 0, wait_timeout: float = 1.0
    ) -> CoordinatorStore:
        """``url``: redis://, rediss://, unix:// or redis+sentinel:// (``_redis``)."""
        return cls(redis_client(url, timeout=timeout), wait_replicas=wait_replicas, wait_timeout=wait_timeout)

    # -- tenants and API keys (SEC-2: only hashes are stored) ---------------------------------------------
    async def create_tenant(self, name: str) -> str:
        """Create tenant ``name`` (or add a key to it) and return a new API key, shown only once."""
        if not name or len(name) > 64 or not all(c.isalnum() or c in "-_" for c in name):
            raise InvalidInputError("name", "must be 1-64 letters, digits, '-' or '_'")
        api_key, digest = new_api_key(API_KEY_PREFIX)
        now = time.time()
        keys = [tenant_key(name), TENANT_SET, api_key_key(digest), tenant_keys_key(name)]
        await self._script("create tenant", self._create_tenant, keys, [repr(now), name, digest])
        return api_key

    async def authenticate(self, api_key: str) -> str:
        """The tenant owning ``api_key``; NotFoundError for an unknown key (no detail on why)."""
        tenant = await self._call(
            "authenticate", lambda: self._redis.get(api_key_key(hash_api_key(api_key))), writes=False
        )
        if tenant is None:
            raise NotFoundError("unknown API key")
        return _text(tenant)

    # -- environments -----------------------------------------------------------------------------
    async def create_environment(self, record: EnvironmentRecord, *, idempotency: str | None = None) -> CreateOutcome:
        """Reserve the record's resources on its node and store it, atomically (placement CAS)."""
        if record.node is None:
            raise InvalidInputError("node", "a new environment must name its node")
        if record.revision != 1:
            raise InvalidInputError("revision", "a new environment record has revision 1")
        need = record.spec.resources
        idem = idempotency_key(record.tenant, idempotency) if idempotency else "adx:idem:-"
        keys = [
            env_key(record.id),
            tenant_index_key(record.tenant),
            node_key(record.node),
            node_reservations_key(record.node),
            idem,
        ]
        args: list[ScriptArg] = [
            record.id,
            record.model_dump_json(by_alias=True),
            record.tenant,
            record.node,
            record.generation,
            record.state.value,
            need.cpu_millis,
            need.memory_bytes,
            need.disk_bytes,
            time.time(),
            record.created_at,
            IDEMPOTENCY_TTL_SECONDS if idempotency else 0,
            _route(record),
        ]
        status, detail = await self._script("create environment", self._create_env, keys, args)
        detail = _text(detail)
        if status == 1:
            return CreateOutcome(record, created=True)
        if status == 2:
            return CreateOutcome(await self.get_environment(detail), created=False)
        if status == -2:
            raise NoCapacity(f"node {record.node} refused: {detail}", details={"node": record.node})
        raise ConflictError(f"environment {record.id}: {detail}")

    async def get_environment(self, env_id: str) -> EnvironmentRecord:
        doc = await self._call("get environment", lambda: self._redis.hget(env_key(env_id), "doc"), writes=False)
        if doc is None:
            raise NotFoundError(f"environment {env_id} not found")
        return EnvironmentRecord.model_validate_json(doc)

    async def get_tenant_environment(self, tenant: str, env_id: str) -> EnvironmentRecord:
        """Like get_environment, but another tenant's Environment is indistinguishable from none (SEC-2)."""
        record = await self.get_environment(env_id)
        if record.tenant != tenant:
            raise NotFoundError(f"environment {env_id} not found")
        return record

    async def load_all_environments(self, *, batch: int = 500) -> list[EnvironmentRecord]:
        """Every stored Environment record (start-up cache load; SCAN, never KEYS)."""

        async def scan() -> list[EnvironmentRecord]:
            records = []
            async for key in self._redis.scan_iter(match=env_key("*"), count=batch):
                doc = await self._redis.hget(key, "doc")
                if doc is not None:
                    records.append(EnvironmentRecord.model_validate_json(doc))
            return records

        return await self._call("load environments", scan, writes=False)

    async def list_environments(self, tenant: str, *, limit: int = 1000) -> list[EnvironmentRecord]:
        ids = await self._call(
            "list environments", lambda: self._redis.zrange(tenant_index_key(tenant), 0, limit - 1), writes=False
        )
        if not ids:
            return []

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for raw in ids:
                    pipe.hget(env_key(_text(raw)), "doc")
                return list(await pipe.execute())

        docs = await self._call("list environments", fetch, writes=False)
        return [EnvironmentRecord.model_validate_json(doc) for doc in docs if doc is not None]

    async def commit_environment(
        self,
        current: EnvironmentRecord,
        changes: RecordChanges,
        *,
        check_generation: bool = True,
        release_reservation: bool = False,
    ) -> EnvironmentRecord:
        """Compare-and-set: apply ``changes`` if the stored revision (and generation) still match ``current``.

        Raises ConflictError (with the stored revision) when someone committed in between.
        """
        now = time.time()
        updated = current.model_copy(update={**changes, "revision": current.revision + 1, "updated_at": now})
        deleting = updated.state is EnvironmentState.DELETED
        if deleting and updated.checkpoint is not None:
            updated = updated.model_copy(update={"checkpoint": None})  # a deleted record references nothing
        node = current.node or "-"
        old_ckpt = current.checkpoint.id if current.checkpoint else ""
        new_ckpt = updated.checkpoint.id if updated.checkpoint else ""
        keys = [
            env_key(current.id),
            node_reservations_key(node),
            node_key(node),
            tenant_index_key(current.tenant),
            checkpoint_key(old_ckpt or "-"),
            checkpoint_key(new_ckpt or "-"),
            RETIRED_CHECKPOINTS,
        ]
        args: list[ScriptArg] = [
            current.revision,
            current.generation if check_generation else "",
            updated.model_dump_json(by_alias=True),
            updated.state.value,
            "1" if (release_reservation or deleting) and current.node else "0",
            DELETED_RECORD_TTL_SECONDS if deleting else 0,
            current.id,
            _route(updated),
            old_ckpt,
            new_ckpt,
            updated.checkpoint.model_dump_json(by_alias=True) if updated.checkpoint else "",
            now,
        ]
        status, detail = await self._compare_and_set("commit environment", self._commit_env, current.id, keys, args)
        if status == 1:
            return updated
        what = "revision" if status == 0 else "generation"
        expected = current.revision if status == 0 else current.generation
        raise ConflictError(
            f"environment {current.id}: stale {what} (expected {expected}, stored {detail})",
            details={"stored_" + what: int(detail)},
        )

    async def _compare_and_set(
        self, what: str, script: Any, env_id: str, keys: list[str], args: list[ScriptArg]
    ) -> tuple[int, str]:
        """Run a compare-and-set script on an Environment record: its status (1: written; others the script's
        refusals) and detail; NotFoundError when the record is gone (-1)."""
        status, detail = await self._script(what, script, keys, args)
        if status == -1:
            raise NotFoundError(f"environment {env_id} not found")
        return status, _text(detail)

    async def record_resume_intent(
        self, current: EnvironmentRecord, changes: RecordChanges, *, node: str, generation: int
    ) -> EnvironmentRecord:
        """CRD-5: compare-and-set ``current`` (paused) to resuming on ``node``, reserving its resources there.

        Raises NoCapacity when the node refuses, ConflictError when someone committed in between.
        """
        updated = current.model_copy(
            update={
                **changes,
                "state": EnvironmentState.RESUMING,
                "node": node,
                "generation": generation,
                "revision": current.revision + 1,
                "updated_at": time.time(),
            }
        )
        need = current.spec.resources
        keys = [env_key(current.id), node_key(node), node_reservations_key(node)]
        args: list[ScriptArg] = [
            current.revision,
            updated.model_dump_json(by_alias=True),
            node,
            generation,
            need.cpu_millis,
            need.memory_bytes,
            need.disk_bytes,
            time.time(),
            current.id,
            _route(updated),
        ]
        status, detail = await self._compare_and_set("record resume intent", self._resume_env, current.id, keys, args)
        if status == 1:
            return updated
        if status == -2:
            raise NoCapacity(f"node {node} refused: {detail}", details={"node": node})
        raise ConflictError(
            f"environment {current.id}: stale revision (expected {current.revision}, stored {detail})",
            details={"stored_revision": int(detail)},
        )

    async def retired_checkpoints(self) -> list[CheckpointRef]:
        """Artifacts no Environment references any more (CRD-9): the nodes delete them, then forget them."""

        async def fetch() -> list[CheckpointRef]:
            refs = []
            for raw in await self._redis.smembers(RETIRED_CHECKPOINTS):
                doc = await self._redis.hget(checkpoint_key(_text(raw)), "doc")
                if doc is not None:
                    refs.append(CheckpointRef.model_validate_json(doc))
            return refs

        return await self._call("retired checkpoints", fetch, writes=False)

    async def snapshot_checkpoints(self) -> list[str]:
        """Every artifact a snapshot holds (CRD-9: part of the global reference list)."""
        raw = await self._call("snapshot checkpoints", lambda: self._redis.smembers(SNAPSHOT_CHECKPOINTS), writes=False)
        return sorted(_text(r) for r in raw)

    async def forget_checkpoint(self, checkpoint_id: str) -> bool:
        """Drop a deleted artifact from the catalog, unless something references it again."""
        status, _ = await self._script(
            "forget checkpoint",
            self._forget_checkpoint,
            [checkpoint_key(checkpoint_id), RETIRED_CHECKPOINTS],
            [checkpoint_id],
        )
        return bool(status == 1)

    async def subscribe_routes(self) -> AsyncGenerator[RouteMessage, None]:
        """Route publications, in publication order, until the connection breaks (then UnavailableError)."""
        pubsub = self._redis.pubsub()
        await self._call("subscribe routes", lambda: pubsub.subscribe(ROUTES_CHANNEL), writes=False)
        return _route_messages(pubsub)


async def _route_messages(pubsub: Any) -> AsyncGenerator[RouteMessage, None]:
    try:
        while True:
            try:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
                raise UnavailableError(f"route publications: Redis connection lost: {exc}") from exc
            if message is not None:
                yield json.loads(message["data"])
    finally:
        await pubsub.aclose()


async def retire_unstarted_environment(
    store: CoordinatorStore, record: EnvironmentRecord, *, idempotency: str | None = None
) -> bool | None:
    """Undo a create nothing started (one script): True retired, None never stored, False kept because a
    node moved it past pending revision 1 meanwhile (it is a real Environment now)."""
    if record.node is None:
        raise InvalidInputError("node", "a created environment names its node")
    keys = [
        env_key(record.id),
        tenant_index_key(record.tenant),
        node_key(record.node),
        node_reservations_key(record.node),
        idempotency_key(record.tenant, idempotency) if idempotency else "adx:idem:-",
    ]
    gone = record.model_copy(update={"state": EnvironmentState.DELETED, "revision": record.revision + 1})
    script = store._redis.register_script(_scripts.RETIRE_UNSTARTED_ENV)
    status, _ = await store._script("retire unstarted environment", script, keys, [record.id, _route(gone)])
    return True if status == 1 else None if status == -1 else False
