"""The Coordinator's store on Redis: the only authority for Environments, nodes, tenants and API keys.

Every change that touches more than one key, or must not overwrite a newer version, is one Lua script
(``_scripts``). Redis errors are translated here: a connection failure before a command was sent is
UnavailableError; a failure after it may have been applied is UncertainOutcomeError, and callers must
reload the authoritative record before acting (CRD-2).

High availability: the daemon's store is fenced (``fence_with``): every script carries the leader lease's
value and refuses to write when the lease is no longer this replica's (NotLeader). With ``wait_replicas``,
each write also waits (``WAIT``) for that many replicas to have it before it is acknowledged.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from adx.coordinator import _scripts
from adx.coordinator._keys import (
    NODE_SET,
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
from adx.coordinator._lease import LEASE_KEY
from adx.coordinator._redis import redis_client
from adx.errors import (
    AdxError,
    ConflictError,
    InvalidInputError,
    NoCapacityError,
    NotFoundError,
    SessionRejectedError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.model import MAX_CPU_OVERCOMMIT, CheckpointRef, EnvironmentRecord, EnvironmentState, NodeRecord, Resources
from adx.model._records import RecordChanges

T = TypeVar("T")

API_KEY_PREFIX = "adxk_"
DELETED_RECORD_TTL_SECONDS = 24 * 3600
IDEMPOTENCY_TTL_SECONDS = 24 * 3600


ScriptArg = str | int | float


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _never_connected(exc: redis_errors.ConnectionError) -> bool:
    # redis-py words connect failures as "Error <errno> connecting to host:port."
    return isinstance(exc.__cause__, ConnectionRefusedError) or " connecting to " in str(exc)


def hash_api_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


#: The node's session is not the registered one: the node must re-register (NOD-6).
SessionRejected = SessionRejectedError


class NotLeader(UnavailableError):
    """This replica no longer holds the leader lease: Redis refused the write (fencing), nothing changed."""

    code = "not_leader"


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


class CoordinatorStore:
    def __init__(self, client: aioredis.Redis, *, wait_replicas: int = 0, wait_timeout: float = 1.0) -> None:
        self._redis = client
        self._fence = ""  # the leader lease value every script must find in Redis ('' = unfenced)
        self._on_fenced: Callable[[str], None] | None = None
        self._wait_replicas = wait_replicas
        self._wait_timeout_ms = max(1, round(wait_timeout * 1000))
        self._create_tenant = client.register_script(_scripts.CREATE_TENANT)
        self._create_env = client.register_script(_scripts.CREATE_ENV)
        self._commit_env = client.register_script(_scripts.COMMIT_ENV)
        self._register_node = client.register_script(_scripts.REGISTER_NODE)
        self._heartbeat = client.register_script(_scripts.HEARTBEAT)
        self._report_capacity = client.register_script(_scripts.REPORT_CAPACITY)
        self._resume_env = client.register_script(_scripts.RESUME_ENV)
        self._forget_checkpoint = client.register_script(_scripts.FORGET_CHECKPOINT)

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 5.0, wait_replicas: int = 0, wait_timeout: float = 1.0
    ) -> CoordinatorStore:
        """``url``: redis://, rediss://, unix:// or redis+sentinel:// (``_redis``)."""
        return cls(redis_client(url, timeout=timeout), wait_replicas=wait_replicas, wait_timeout=wait_timeout)

    def fence_with(self, lease_value: str, on_fenced: Callable[[str], None]) -> None:
        """From now on every write requires the leader lease to hold ``lease_value``; ``on_fenced(holder)``
        is told when Redis refused one (the caller stops serving)."""
        self._fence = lease_value
        self._on_fenced = on_fenced

    async def _script(self, what: str, script: Any, keys: list[str], args: list[ScriptArg]) -> tuple[int, Any]:
        """Run a fenced write script; raises NotLeader when this replica's lease is gone (nothing written)."""
        keys = [*keys, LEASE_KEY]
        args = [*args, self._fence]

        async def op() -> Any:
            if not self._wait_replicas:
                return await script(keys=keys, args=args)
            # WAIT must follow the write on the same connection: one pipeline (not a transaction).
            async with self._redis.pipeline(transaction=False) as pipe:
                await script(keys=keys, args=args, client=pipe)
                pipe.execute_command("WAIT", self._wait_replicas, self._wait_timeout_ms)
                result, acks = await pipe.execute()
            if int(result[0]) == 1 and int(acks) < self._wait_replicas:
                raise UncertainOutcomeError(
                    f"{what}: written on the Redis primary but confirmed by {acks} of {self._wait_replicas} "
                    "replicas in time (redis_wait_replicas); a failover now could lose it"
                )
            return result

        status, detail = await self._call(what, op, writes=True)
        if int(status) == _scripts.FENCED:
            holder = _text(detail)
            if self._on_fenced is not None:
                self._on_fenced(holder)
            raise NotLeader(f"{what}: refused: this Coordinator replica lost the leader lease (standby)")
        return int(status), detail

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, what: str, op: Callable[[], Awaitable[T]], *, writes: bool) -> T:
        try:
            return await op()
        except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
            # The server went away or stalled: its other pooled connections are as suspect as this one.
            await self._redis.connection_pool.disconnect(inuse_connections=False)
            raise self._translate(what, exc, writes) from exc
        except redis_errors.RedisError as exc:
            raise UnavailableError(f"{what}: Redis error: {exc}") from exc

    @staticmethod
    def _translate(what: str, exc: redis_errors.RedisError, writes: bool) -> AdxError:
        if isinstance(exc, redis_errors.ConnectionError):
            # A connection that could not be made never carried the command; a lost one may have.
            if writes and not _never_connected(exc):
                return UncertainOutcomeError(f"{what}: connection lost after sending; outcome unknown")
            return UnavailableError(f"{what}: Redis unavailable: {exc}")
        if writes:
            return UncertainOutcomeError(f"{what}: Redis timed out; outcome unknown")
        return UnavailableError(f"{what}: Redis timed out")

    async def ping(self) -> None:
        await self._call("ping", self._redis.ping, writes=False)

    # -- tenants and API keys (SEC-2: only hashes are stored) ---------------------------------------------
    async def create_tenant(self, name: str) -> str:
        """Create tenant ``name`` (or add a key to it) and return a new API key, shown only once."""
        if not name or len(name) > 64 or not all(c.isalnum() or c in "-_" for c in name):
            raise InvalidInputError("name", "must be 1-64 letters, digits, '-' or '_'")
        api_key = API_KEY_PREFIX + secrets.token_urlsafe(32)
        now = time.time()

        digest = hash_api_key(api_key)
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
        status, detail = await self._script("commit environment", self._commit_env, keys, args)
        detail = _text(detail)
        if status == 1:
            return updated
        if status == -1:
            raise NotFoundError(f"environment {current.id} not found")
        what = "revision" if status == 0 else "generation"
        expected = current.revision if status == 0 else current.generation
        raise ConflictError(
            f"environment {current.id}: stale {what} (expected {expected}, stored {detail})",
            details={"stored_" + what: int(detail)},
        )

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
        status, detail = await self._script("record resume intent", self._resume_env, keys, args)
        detail = _text(detail)
        if status == 1:
            return updated
        if status == -1:
            raise NotFoundError(f"environment {current.id} not found")
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

    # -- nodes ------------------------------------------------------------------------------------
    async def register_node(
        self,
        name: str,
        *,
        session: str,
        address: str,
        relay_address: str = "",
        session_ttl: float = 15.0,
        checkpoint_capable: bool = False,
        shared_storage: bool = False,
    ) -> str:
        """Register (or re-register) a node under a new process session; returns the previous session."""
        args: list[ScriptArg] = [
            session,
            session_ttl,
            time.time(),
            address,
            relay_address,
            int(checkpoint_capable),
            int(shared_storage),
            name,
        ]
        _, previous = await self._script("register node", self._register_node, [node_key(name), NODE_SET], args)
        return _text(previous)

    async def heartbeat(self, name: str, session: str, session_ttl: float = 15.0) -> None:
        status, detail = await self._script(
            "heartbeat", self._heartbeat, [node_key(name)], [session, session_ttl, time.time()]
        )
        self._check_node_status(name, status, detail)

    async def report_capacity(
        self,
        name: str,
        session: str,
        capacity: Resources,
        *,
        valid_for: float,
        admission_open: bool = True,
        admission_reason: str = "",
        devices: Sequence[str] = (),
        cpu_overcommit: float = 1.0,
    ) -> None:
        """Replace the node's capacity sample (RES-4). ``cpu_overcommit``: how far its CPU reservations may exceed
        its CPU capacity (0: a node that does not say, i.e. one of an earlier version: 1.0, no overcommit)."""
        ratio = cpu_overcommit or 1.0
        if not 1.0 <= ratio <= MAX_CPU_OVERCOMMIT:  # also refuses NaN
            raise InvalidInputError("cpuOvercommit", f"must be between 1 and {MAX_CPU_OVERCOMMIT:g}, got {ratio!r}")
        args: list[ScriptArg] = [
            session,
            capacity.cpu_millis,
            capacity.memory_bytes,
            capacity.disk_bytes,
            time.time() + valid_for,
            "1" if admission_open else "0",
            admission_reason,
            json.dumps(list(devices)),
            repr(ratio),
        ]
        status, detail = await self._script("report capacity", self._report_capacity, [node_key(name)], args)
        self._check_node_status(name, status, detail)

    @staticmethod
    def _check_node_status(name: str, status: int, detail: Any) -> None:
        if status == 1:
            return
        if status == -1:
            raise NotFoundError(f"node {name} is not registered")
        raise SessionRejected(f"node {name}: session is not the registered one")

    async def get_node(self, name: str) -> NodeRecord:
        raw = await self._call("get node", lambda: self._redis.hgetall(node_key(name)), writes=False)
        if not raw:
            raise NotFoundError(f"node {name} not found")
        return _node_from_hash(name, {_text(k): _text(v) for k, v in raw.items()})

    async def list_nodes(self) -> list[NodeRecord]:
        names = await self._call("list nodes", lambda: self._redis.smembers(NODE_SET), writes=False)
        nodes = []
        for raw in sorted(names):
            try:
                nodes.append(await self.get_node(_text(raw)))
            except NotFoundError:
                continue
        return nodes

    async def node_reservations(self, name: str) -> dict[str, Resources]:
        raw = await self._call(
            "node reservations", lambda: self._redis.hgetall(node_reservations_key(name)), writes=False
        )
        out = {}
        for env_id, held in raw.items():
            cpu, mem, disk = (int(x) for x in _text(held).split())
            out[_text(env_id)] = Resources(cpu_millis=cpu, memory_bytes=mem, disk_bytes=disk)
        return out


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


def _node_from_hash(name: str, h: dict[str, str]) -> NodeRecord:
    return NodeRecord(
        name=name,
        address=h.get("address", ""),
        relay_address=h.get("relay_address", ""),
        session=h.get("session", ""),
        session_expires_at=float(h.get("session_expires_at", 0)),
        capacity=Resources(
            cpu_millis=int(h.get("cap_cpu", 0)),
            memory_bytes=int(h.get("cap_mem", 0)),
            disk_bytes=int(h.get("cap_disk", 0)),
        ),
        capacity_valid_until=float(h.get("cap_valid_until", 0)),
        admission_open=h.get("admission") == "1",
        admission_reason=h.get("admission_reason", ""),
        devices=json.loads(h.get("devices") or "[]"),
        reserved=Resources(
            cpu_millis=int(h.get("res_cpu", 0)),
            memory_bytes=int(h.get("res_mem", 0)),
            disk_bytes=int(h.get("res_disk", 0)),
        ),
        checkpoint_capable=h.get("checkpoint_capable") == "1",
        shared_storage=h.get("shared_storage") == "1",
        cpu_overcommit=float(h.get("cpu_overcommit") or 1.0),
        cordoned=h.get("cordoned") == "1",
    )


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
