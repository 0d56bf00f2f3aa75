"""ADX Environments from a graph node: ``env = await ctx.environment("box", cpu=1, memory="512Mi")``.

An Environment belongs to the run and a name, not to one node: every node of the run that asks for the same name
gets the same Environment, also after the run's worker died. The order of writes makes that hold:

1. a row (run, name, the create's idempotency key) is committed, fenced, before anything is sent to the API;
2. the Environment is created through the public SDK with that idempotency key (and labelled with it);
3. its ID is committed, fenced, before the node sees the create complete.

A run recovered after a crash between 1 and 3 sends the same create again: the API answers the Environment the
first create made (its Idempotency-Key), or, past the key's retention, the label finds it. While the run waits,
its Environments are paused; a node that asks for one resumes it. When the run ends they are deleted unless
created with ``keep=True``.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from adx.agents._canonical import JsonObject
from adx.agents._errors import StaleFenceError
from adx.agents._pg import Conn
from adx.agents._rows import Claim
from adx.agents._store import AgentStore
from adx.errors import AdxError, ConflictError, InvalidInputError, NotFoundError
from adx.model import PauseOptions, RestartPolicy
from adx.sdk import AsyncClient, AsyncEnvironment, EnvironmentState, IdleAction, build_spec

__all__ = ["EnvironmentAccess", "EnvironmentBroker", "EnvironmentSpec", "RunEnvironment"]

log = logging.getLogger("adx.agents.environments")

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
#: Labels every Environment a run creates carries (metadata), so an operator and the recovery path find it.
LABEL_RUN = "adx-agent-run"
LABEL_NAME = "adx-agent-environment"
LABEL_KEY = "adx-agent-key"
_GONE = (EnvironmentState.DELETING, EnvironmentState.DELETED)


@dataclass(frozen=True, slots=True)
class EnvironmentAccess:
    """How a worker reaches the ADX API: its URL and the tenant API key its runs create Environments with."""

    api_url: str
    api_key: str = field(repr=False)
    timeout_seconds: float = 30.0
    #: How long a create, or a resume on use, may take before the node fails (and is retried).
    ready_timeout_seconds: float = 120.0

    def __post_init__(self) -> None:
        if not self.api_url.startswith(("http://", "https://")):
            raise InvalidInputError("environments.api_url", "must start with http:// or https://")
        if not self.api_key:
            raise InvalidInputError("environments.api_key", "must not be empty")
        for name in ("timeout_seconds", "ready_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise InvalidInputError(f"environments.{name}", "must be positive")


@dataclass(frozen=True, slots=True)
class EnvironmentSpec:
    """What ``ctx.environment(...)`` creates when the run has no Environment of that name yet (SDK names)."""

    image: str | None = None
    cpu: float | str = 1
    memory: int | str = "512Mi"
    disk: int | str | None = None
    env: Mapping[str, str] | None = None
    metadata: Mapping[str, str] | None = None
    idle_timeout: float | None = None
    idle_action: IdleAction | str | None = None
    pause: PauseOptions | None = None
    restart: RestartPolicy | None = None
    lifetime: float | None = None
    lifetime_action: IdleAction | str | None = None

    def create_arguments(self, labels: Mapping[str, str]) -> JsonObject:
        metadata = dict(self.metadata or {})
        clash = sorted(set(metadata) & set(labels))
        if clash:
            raise InvalidInputError("metadata", f"{clash} are set by the agent runtime")
        metadata.update(labels)
        return {
            "image": self.image,
            "cpu": self.cpu,
            "memory": self.memory,
            "disk": self.disk,
            "env": self.env,
            "metadata": metadata,
            "idle_timeout": self.idle_timeout,
            "idle_action": self.idle_action,
            "pause": self.pause,
            "restart": self.restart,
            "lifetime": self.lifetime,
            "lifetime_action": self.lifetime_action,
        }


@dataclass(frozen=True, slots=True)
class _Row:
    name: str
    generation: int
    idempotency_key: str
    environment_id: str | None
    status: str
    keep: bool

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> _Row:
        return cls(
            row["name"],
            int(row["generation"]),
            row["idempotency_key"],
            row["environment_id"],
            row["status"],
            bool(row["keep"]),
        )


def _key(claim: Claim, name: str, generation: int) -> str:
    return f"agent-env/{claim.key.tenant_id}/{claim.key.run_id}/{name}/{generation}"


class _Rows:
    """The run's environment rows: every write is fenced (it changes nothing once the run's fence moved on)."""

    def __init__(self, store: AgentStore) -> None:
        self.store = store

    async def read(self, claim: Claim, name: str | None = None) -> list[_Row]:
        async with self.store.connection("read run environments") as conn:
            cur = await conn.execute(
                "SELECT * FROM adx_agent_environments WHERE tenant_id = %s AND run_id = %s"
                " AND (%s::text IS NULL OR name = %s) ORDER BY name",
                (claim.key.tenant_id, claim.key.run_id, name, name),
            )
            return [_Row.of(r) for r in await cur.fetchall()]

    async def intend(self, claim: Claim, name: str, generation: int, keep: bool, spec: JsonObject) -> _Row:
        """Record the intent to create (or, after a deletion, re-create) ``name``; the stored row wins."""
        key = _key(claim, name, generation)
        async with self.store.transaction("record environment intent") as conn:
            cur = await conn.execute(
                "INSERT INTO adx_agent_environments AS e (tenant_id, run_id, name, generation, idempotency_key,"
                " status, keep, spec, fence) SELECT tenant_id, run_id, %(n)s, %(g)s, %(k)s, 'creating', %(keep)s,"
                " %(spec)s, fence FROM adx_agent_runs WHERE tenant_id = %(t)s AND run_id = %(r)s AND fence = %(f)s"
                " AND lease_owner = %(o)s"
                " ON CONFLICT (tenant_id, run_id, name) DO UPDATE SET generation = EXCLUDED.generation,"
                " idempotency_key = EXCLUDED.idempotency_key, environment_id = NULL, status = 'creating',"
                " keep = EXCLUDED.keep, spec = EXCLUDED.spec, fence = EXCLUDED.fence, updated_at = now()"
                " WHERE e.status = 'deleted' AND e.generation < EXCLUDED.generation RETURNING 1",
                {
                    "n": name,
                    "g": generation,
                    "k": key,
                    "keep": keep,
                    "spec": Jsonb(spec),
                    "t": claim.key.tenant_id,
                    "r": claim.key.run_id,
                    "f": claim.fence,
                    "o": claim.owner,
                },
            )
            inserted = await cur.fetchone() is not None
            await self._check_fence(conn, claim)
        rows = await self.read(claim, name)
        if not rows:
            raise StaleFenceError(f"run {claim.key.run_id}: fence {claim.fence} is no longer held")
        if not inserted:
            log.info("environment intent already recorded", extra={"run_id": str(claim.key.run_id), "env": name})
        return rows[0]

    async def update(
        self, claim: Claim, name: str, key: str, *, status: str, environment_id: str | None = None
    ) -> None:
        """Set the row's status (and the Environment ID once known) for the generation named by ``key``."""
        async with self.store.transaction("record environment", single_statement=True) as conn:
            cur = await conn.execute(
                "UPDATE adx_agent_environments e SET status = %s, environment_id = COALESCE(%s, e.environment_id),"
                " fence = r.fence, updated_at = now() FROM adx_agent_runs r WHERE e.tenant_id = %s AND e.run_id = %s"
                " AND e.name = %s AND e.idempotency_key = %s AND r.tenant_id = e.tenant_id AND r.run_id = e.run_id"
                " AND r.fence = %s AND r.lease_owner = %s RETURNING 1",
                (status, environment_id, claim.key.tenant_id, claim.key.run_id, name, key, claim.fence, claim.owner),
            )
            if await cur.fetchone() is None:
                raise StaleFenceError(f"run {claim.key.run_id}: fence {claim.fence} is no longer held")

    async def _check_fence(self, conn: Conn, claim: Claim) -> None:
        cur = await conn.execute(
            "SELECT 1 FROM adx_agent_runs WHERE tenant_id = %s AND run_id = %s AND fence = %s AND lease_owner = %s",
            (claim.key.tenant_id, claim.key.run_id, claim.fence, claim.owner),
        )
        if await cur.fetchone() is None:
            raise StaleFenceError(f"run {claim.key.run_id}: fence {claim.fence} is no longer held")


class RunEnvironment:
    """A run's Environment as a node uses it, with the SDK's ``commands`` and ``files``. Operations run at least
    once, like the node's own code: a node that runs again after a crash runs them again, on the same Environment."""

    def __init__(self, broker: EnvironmentBroker, claim: Claim, row: _Row, environment: AsyncEnvironment) -> None:
        self._broker = broker
        self._claim = claim
        self._row = row
        self.environment = environment  # the SDK object, for everything else the SDK offers
        #: ``await env.commands.run("make test")`` -> CommandResult (exit_code, stdout, stderr); ``.stream(...)``
        self.commands = environment.commands
        #: ``await env.files.write(path, data)``, ``.read(path)``, ``.list``, ``.stat``, ``.mkdir``, ``.delete``
        self.files = environment.files

    @property
    def id(self) -> str:
        return self.environment.id

    @property
    def name(self) -> str:
        return self._row.name

    @property
    def keep(self) -> bool:
        return self._row.keep

    async def delete(self) -> None:
        """Delete the Environment now; a later ``ctx.environment(name)`` of this run creates a new one."""
        await self._broker.delete(self._claim, self._row, self.environment.id)


class EnvironmentBroker:
    """Creates, reattaches, pauses and deletes the Environments of the runs one driver drives."""

    def __init__(self, store: AgentStore, access: EnvironmentAccess) -> None:
        self.access = access
        self._rows = _Rows(store)
        self._client: AsyncClient | None = None

    @property
    def client(self) -> AsyncClient:
        # One pooled client per driver, made on first use (inside the worker's event loop).
        if self._client is None:
            self._client = AsyncClient(self.access.api_url, self.access.api_key, timeout=self.access.timeout_seconds)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def open(self, claim: Claim, name: str, spec: EnvironmentSpec, keep: bool) -> RunEnvironment:
        """The run's Environment ``name``: reattached when the run has one, created otherwise (see module doc)."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidInputError("name", "must be 1-63 characters of a-z, 0-9, '_' or '-', starting alphanumeric")
        rows = await self._rows.read(claim, name)
        row = rows[0] if rows else None
        if row is not None and row.status != "deleted":
            environment = await self._reattach(claim, row, spec)
            if environment is not None:
                return RunEnvironment(self, claim, row, environment)
            rows = await self._rows.read(claim, name)
            row = rows[0] if rows else None
        generation = 1 if row is None else row.generation + 1
        labels = {LABEL_RUN: str(claim.key.run_id), LABEL_NAME: name, LABEL_KEY: _key(claim, name, generation)}
        arguments = spec.create_arguments(labels)
        wire = build_spec(**arguments)  # validated here: bad input fails before anything is recorded
        row = await self._rows.intend(claim, name, generation, keep, wire)
        environment = await self._create(claim, row, spec, recovering=False)
        return RunEnvironment(self, claim, row, environment)

    async def _create(self, claim: Claim, row: _Row, spec: EnvironmentSpec, *, recovering: bool) -> AsyncEnvironment:
        labels = {LABEL_RUN: str(claim.key.run_id), LABEL_NAME: row.name, LABEL_KEY: row.idempotency_key}
        # Recovering an unknown outcome: the label finds what an earlier create made even after the API forgot
        # its key (24 h); a create still in flight is not listed yet, and the same key answers it instead.
        environment = await self._find(row.idempotency_key) if recovering else None
        if environment is None:
            environment = await self.client.environments.create(
                **spec.create_arguments(labels), wait=False, idempotency_key=row.idempotency_key
            )
        # Recorded before anyone can see the create complete (we have not waited for it yet).
        await self._rows.update(claim, row.name, row.idempotency_key, status="active", environment_id=environment.id)
        log.info(
            "environment created",
            extra={"run_id": str(claim.key.run_id), "env": row.name, "env_id": environment.id},
        )
        await environment.wait_until_running(self.access.ready_timeout_seconds)
        return environment

    async def _find(self, key: str) -> AsyncEnvironment | None:
        """The live Environment a create with ``key`` made, by its label (the create's key may have expired)."""
        for environment in await self.client.environments.list():
            if environment.metadata.get(LABEL_KEY) == key and environment.state not in _GONE:
                return environment
        return None

    async def _reattach(self, claim: Claim, row: _Row, spec: EnvironmentSpec) -> AsyncEnvironment | None:
        """The recorded Environment, running; None when it is gone (the row is then marked deleted)."""
        if row.environment_id is None:
            # The create's outcome is unknown (the worker died before recording it): the same key again.
            return await self._create(claim, row, spec, recovering=True)
        try:
            environment = await self.client.environments.get(row.environment_id)
        except NotFoundError:
            environment = None
        if environment is None or environment.state in _GONE or environment.state == EnvironmentState.FAILED:
            log.warning(
                "recorded environment is gone or failed; creating a new one",
                extra={"run_id": str(claim.key.run_id), "env": row.name, "env_id": row.environment_id},
            )
            if environment is not None and environment.state == EnvironmentState.FAILED:
                with contextlib.suppress(AdxError):  # it holds no work we can use; do not leave it behind
                    await environment.delete()
            await self._rows.update(claim, row.name, row.idempotency_key, status="deleted")
            return None
        if environment.state in (EnvironmentState.PAUSED, EnvironmentState.PAUSING):
            await self._resume(environment)
        await environment.wait_until_running(self.access.ready_timeout_seconds)
        if row.status != "active":
            await self._rows.update(claim, row.name, row.idempotency_key, status="active")
        log.info(
            "environment reattached",
            extra={"run_id": str(claim.key.run_id), "env": row.name, "env_id": environment.id},
        )
        return environment

    async def _resume(self, environment: AsyncEnvironment) -> None:
        try:
            await environment.resume()
        except ConflictError:
            await environment.refresh()  # resumed meanwhile (or still pausing: the wait below decides)

    async def delete(self, claim: Claim, row: _Row, environment_id: str) -> None:
        with contextlib.suppress(NotFoundError):  # already gone: deleted is what we want
            await self.client.environments.delete(environment_id)
        await self._rows.update(claim, row.name, row.idempotency_key, status="deleted")

    async def pause_all(self, claim: Claim) -> None:
        """The run waits: pause its active Environments (a failure is logged; the wait goes on)."""
        for row in await self._rows.read(claim):
            if row.status != "active" or row.environment_id is None:
                continue
            try:
                environment = await self.client.environments.get(row.environment_id)
                if environment.state not in (EnvironmentState.PAUSED, EnvironmentState.PAUSING, *_GONE):
                    await environment.pause()
                await self._rows.update(claim, row.name, row.idempotency_key, status="paused")
            except AdxError as exc:
                log.warning(
                    "could not pause a waiting run's environment",
                    extra={"run_id": str(claim.key.run_id), "env_id": row.environment_id, "error": str(exc)},
                )

    async def delete_all(self, claim: Claim) -> None:
        """The run ends: delete its Environments but those created with ``keep=True``."""
        for row in await self._rows.read(claim):
            if row.keep or row.status == "deleted":
                continue
            try:
                environment_id = row.environment_id
                if environment_id is None:
                    found = await self._find(row.idempotency_key)
                    environment_id = found.id if found is not None else None
                if environment_id is not None:
                    await self.delete(claim, row, environment_id)
                else:
                    await self._rows.update(claim, row.name, row.idempotency_key, status="deleted")
            except AdxError as exc:
                log.warning(
                    "could not delete a finished run's environment",
                    extra={"run_id": str(claim.key.run_id), "env_id": row.environment_id, "error": str(exc)},
                )
