"""A client for application code: submit by graph name and version, wait for typed results, resolve approvals.

It needs only the database URL: what admitting a run requires (the graph's digest and schemas) comes from
the catalog the workers publish (:mod:`adx.agents._catalog`), so the submitting process never imports the
worker's code nor builds its registry.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar, overload

from pydantic import BaseModel, ValidationError

from adx.agents._api import AgentRuns
from adx.agents._authoring import App
from adx.agents._canonical import JsonObject
from adx.agents._catalog import published_registry
from adx.agents._rows import ResolveOutcome
from adx.agents._status import RunStatus
from adx.agents._store import AgentStore
from adx.agents._views import RunPage, RunView
from adx.errors import InvalidInputError

__all__ = ["Client", "Finished"]

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
RunRef = uuid.UUID | str | RunView


@dataclass(frozen=True, slots=True)
class Finished(Generic[T]):
    """A finished run: ``output`` is the artifact (as the requested model) when it succeeded."""

    run_id: uuid.UUID
    status: RunStatus
    output: T | None
    failure: JsonObject | None
    usage: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.SUCCEEDED


def _run_id(run: RunRef) -> uuid.UUID | str:
    return run.run_id if isinstance(run, RunView) else run


class Client:
    """``async with await Client.connect(url, tenant="default") as client: await client.submit("support", {...})``."""

    def __init__(self, store: AgentStore, tenant: str, *, owns_store: bool = False) -> None:
        self.store = store
        self.tenant = tenant
        self.runs = AgentRuns(store)  # reads and operations need no registry
        self._owns_store = owns_store
        self._tenant_ready = False

    @classmethod
    async def connect(cls, database_url: str | None = None, *, tenant: str | None = None) -> Client:
        """Connect (never migrates). Defaults: ``ADX_AGENT_DATABASE_URL``, ``ADX_AGENT_TENANT``, else "default"."""
        url = database_url or os.environ.get("ADX_AGENT_DATABASE_URL")
        if not url:
            raise InvalidInputError(
                "database_url", "is required (or set ADX_AGENT_DATABASE_URL; adx agent dev prints it)"
            )
        if not url.startswith(("postgresql://", "postgres://")):
            raise InvalidInputError("database_url", "must be a postgresql:// URL")
        store = await AgentStore.open(url, min_size=1, max_size=4, migrate=False)
        return cls(store, tenant or os.environ.get("ADX_AGENT_TENANT") or "default", owns_store=True)

    async def close(self) -> None:
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def submit(
        self,
        graph: str | App,
        input: Any,
        *,
        version: int | str | None = None,
        budget: JsonObject | None = None,
        idempotency_key: str | None = None,
        deadline_seconds: float | None = None,
    ) -> RunView:
        """Admit a run of ``graph`` (a name, or the :class:`App`) at ``version`` (default: the App's, else the
        one a worker published last). ``input`` is a model or JSON, validated against the published input schema."""
        if isinstance(version, bool) or not isinstance(version, int | str | None):
            raise InvalidInputError("version", "must be an integer or a string")
        name = graph.name if isinstance(graph, App) else graph
        wanted: str | None = str(version) if version is not None else None
        if wanted is None and isinstance(graph, App):
            wanted = graph.version
        document = input.model_dump(mode="json") if isinstance(input, BaseModel) else input
        registry = await published_registry(self.store, name, wanted)
        [executable] = registry.graphs()
        if not self._tenant_ready:
            await self.store.ensure_tenant(self.tenant)
            self._tenant_ready = True
        return await AgentRuns(self.store, registry).submit(
            self.tenant,
            name,
            executable.version,
            document,
            budget=budget,
            idempotency_key=idempotency_key,
            deadline_seconds=deadline_seconds,
        )

    @overload
    async def wait(
        self,
        run: RunRef,
        *,
        output: type[M],
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Finished[M]: ...
    @overload
    async def wait(
        self,
        run: RunRef,
        *,
        output: None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Finished[Any]: ...
    async def wait(
        self,
        run: RunRef,
        *,
        output: type[M] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline on polling, as AgentRuns.wait
    ) -> Finished[Any]:
        """Wait until the run finished (TimeoutError after ``timeout`` s); its output parsed as ``output``."""
        result = await self.runs.wait(self.tenant, _run_id(run), timeout=timeout)
        value: Any = result.artifact
        if output is not None and result.status is RunStatus.SUCCEEDED:
            try:
                value = output.model_validate(result.artifact)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "output"
                raise InvalidInputError(
                    f"output.{where}", f"the run's artifact is not a {output.__name__}: {first['msg']}"
                ) from None
        return Finished(result.run_id, result.status, value, result.failure, dict(result.usage))

    async def get(self, run: RunRef) -> RunView:
        return await self.runs.get_run(self.tenant, _run_id(run))

    async def list(
        self, *, status: RunStatus | str | None = None, graph: str | None = None, limit: int = 50
    ) -> RunPage:
        return await self.runs.list_runs(self.tenant, status=status, graph=graph, limit=limit)

    async def resolve(self, run: RunRef, wait_id: str, resolution: Any = True) -> ResolveOutcome:
        """Answer interrupt ``wait_id`` (an approval); before the run reaches it, it is stored and used there."""
        value = resolution.model_dump(mode="json") if isinstance(resolution, BaseModel) else resolution
        return await self.runs.resolve(self.tenant, _run_id(run), wait_id, value)

    async def cancel(self, run: RunRef) -> RunView:
        return await self.runs.request_cancellation(self.tenant, _run_id(run))
