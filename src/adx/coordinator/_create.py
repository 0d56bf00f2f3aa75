"""Creating an Environment: rank the nodes, store the record, hand it to its node; refusals that pass by
themselves move on to the next node, and an uncertain store write is undone so that "nothing was created"
is true whenever the caller is told so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from adx._backoff import Backoff
from adx._node_client import NodeClients
from adx.coordinator._cache import CoordinatorCache
from adx.coordinator._placement import NO_CAPACITY, Refusal, count_placed, rank_nodes
from adx.coordinator._store import CoordinatorStore, NoCapacity, retire_unstarted_environment
from adx.errors import AdxError, InvalidInputError, NotFoundError, UnavailableError, UncertainOutcomeError
from adx.model import (
    ENVIRONMENT,
    CheckpointRef,
    CheckpointStorage,
    EnvironmentRecord,
    EnvironmentSpec,
    EnvironmentState,
    NodeRecord,
    new_id,
)

log = logging.getLogger("adx.coordinator")

#: When a create refused for a passing reason (no node admitting now, Redis unavailable) may be sent again: about
#: one node report interval, after which a node that lost the Coordinator for a moment admits again.
CREATE_RETRY_SECONDS = 2.0
#: When a create no node has room for may be sent again (resources free up as Environments end or pause).
NO_CAPACITY_RETRY_SECONDS = 5.0
#: Placement refusals that pass by themselves (a node reports again, registers again, or its sample refreshes).
_PASSING_REFUSALS = (
    "node session expired",
    "node admission closed",
    "node capacity sample expired",
    "not admitting new Environments now",
)
#: How a node words "not admitting now" (UnavailableError; ConflictError from nodes of an earlier version).
NOT_ADMITTING = "not admitting new Environments now"
#: InvalidInputError fields that name a deployment fault (certificates, a node address that reaches another
#: node), not a spec the node can never run: such a refusal is passing, never a reason to fail the create.
_NOT_THE_SPECS_FAULT = frozenset({"credentials", "environment.node"})


def _passing(reason: str) -> bool:
    return any(marker in reason for marker in _PASSING_REFUSALS)


class NotAdmitting(UnavailableError):
    """No node takes new Environments right now for a passing reason, or the store cannot take the create;
    nothing of the create was committed: send it again after ``details["retry_after_seconds"]`` (HTTP 503)."""

    code = "not_admitting"


class EnvironmentCreator:
    """The create pipeline of the Coordinator's service (CreateEnvironment, and creates from a snapshot)."""

    def __init__(self, store: CoordinatorStore, cache: CoordinatorCache, nodes: NodeClients | None) -> None:
        self.store = store
        self.cache = cache
        self.nodes = nodes
        # Creates whose store outcome was uncertain, retired once Redis answers (nothing of them must remain).
        self._unsettled: dict[str, tuple[EnvironmentRecord, str | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def _refresh_node(self, node: str) -> None:
        self.cache.nodes[node] = await self.store.get_node(node)

    async def create(
        self, tenant: str, spec: EnvironmentSpec, idempotency: str | None, restore: CheckpointRef | None = None
    ) -> tuple[EnvironmentRecord, bool]:
        """Place, store and hand over a new Environment. An infrastructure blip never fails it: a node that is
        not admitting now (or cannot be reached) gets its record retired and the next ranked node is tried;
        when none takes it, the caller gets a retryable NotAdmitting and nothing of the create remains.

        ``restore``: a snapshot's checkpoint the first start restores (the record names it until Running); only
        nodes that can read it are candidates (its own node for a local one, shared-storage nodes otherwise)."""
        now = time.time()
        lifecycle = spec.lifecycle

        def candidates() -> list[NodeRecord]:
            nodes = list(self.cache.nodes.values())
            if restore is None:
                return nodes
            if restore.storage == "local":
                return [n for n in nodes if n.name == restore.node]
            return [n for n in nodes if n.name == restore.node or n.shared_storage]

        def rank() -> tuple[list[NodeRecord], list[Refusal]]:
            return rank_nodes(
                candidates(),
                spec.resources,
                now,
                needs_checkpoint=lifecycle.may_pause,
                needs_shared_storage=lifecycle.pause_options is not None
                and lifecycle.pause_options.storage is CheckpointStorage.SHARED,
            )

        ranked, refused = rank()
        if not ranked and any(r.reason.startswith(NO_CAPACITY) for r in refused):
            # Cached reservations are refreshed by the nodes' reports, so they lag a release (a delete that just
            # returned): ask the authority before refusing for capacity.
            for refusal in refused:
                if refusal.reason.startswith(NO_CAPACITY):
                    await self._refresh_node(refusal.node)
            ranked, refused = rank()
        for node in ranked:
            record = EnvironmentRecord(
                id=new_id(ENVIRONMENT),
                tenant=tenant,
                spec=spec,
                state=EnvironmentState.PENDING,
                node=node.name,
                generation=1,
                revision=1,
                created_at=now,
                updated_at=now,
                expires_at=now + lifecycle.lifetime_seconds if lifecycle.lifetime_seconds else None,
                checkpoint=restore,
            )
            try:
                outcome = await self.store.create_environment(record, idempotency=idempotency)
            except NoCapacity as exc:
                refused.append(Refusal(node.name, exc.message))
                continue
            except UnavailableError as exc:
                # Redis refused the connection: the script never ran, nothing was stored.
                raise NotAdmitting(
                    f"the Coordinator cannot store new Environments now ({exc}); nothing was created, retry shortly",
                    details={"retry_after_seconds": CREATE_RETRY_SECONDS},
                ) from None
            except UncertainOutcomeError as exc:
                await self._settle_uncertain_create(record, idempotency, exc)
                raise AssertionError("unreachable") from None  # _settle_uncertain_create always raises
            except NotFoundError:
                # A replay of a key whose first create was just retired (its node refused it): ask again.
                raise NotAdmitting(
                    "an earlier request with this Idempotency-Key was just refused by its node; retry shortly",
                    details={"retry_after_seconds": CREATE_RETRY_SECONDS},
                ) from None
            if not outcome.created:
                if outcome.record.id in self._unsettled:
                    # A replay of an uncertain create the caller was told failed: finish retiring it, then create.
                    if not await self._retire_unstarted(outcome.record, idempotency, cached=False):
                        raise NotAdmitting(
                            "an earlier attempt of this create is still being undone; retry shortly",
                            details={"retry_after_seconds": CREATE_RETRY_SECONDS},
                        )
                    self._unsettled.pop(outcome.record.id, None)
                    return await self.create(tenant, spec, idempotency, restore)
                self.cache.apply(outcome.record)
                return outcome.record, False
            self.cache.apply(outcome.record)
            self.cache.nodes[node.name] = count_placed(self.cache.nodes.get(node.name, node), spec.resources)
            log.info("environment placed", extra={"env_id": record.id, "node": node.name, "tenant": tenant})
            admitted = await self._admit(outcome.record, node, idempotency, refused)
            if admitted is not None:
                return admitted, True
        reasons = "; ".join(f"{r.node}: {r.reason}" for r in refused) or "no nodes are registered"
        if refused and all(_passing(r.reason) for r in refused):
            raise NotAdmitting(
                f"no node can take this Environment now ({reasons}); nothing was created, "
                f"retry after {CREATE_RETRY_SECONDS:g}s",
                details={"refusals": reasons, "retry_after_seconds": CREATE_RETRY_SECONDS},
            )
        raise NoCapacity(
            f"no node can take this Environment now ({reasons})",
            details={"refusals": reasons, "retry_after_seconds": NO_CAPACITY_RETRY_SECONDS},
        )

    async def _admit(
        self, record: EnvironmentRecord, node: NodeRecord, idempotency: str | None, refused: list[Refusal]
    ) -> EnvironmentRecord | None:
        """Hand a placed Environment to its node.

        - taken: the node's record;
        - the node cannot be reached, or its reply was lost: it stays Pending there, and the node starts it from
          its catalog once it admits again (NOD-3);
        - the node answered that it is not admitting now (or another refusal that says nothing about the spec):
          None, the record was retired and the caller tries the next node (never a Failed create);
        - a permanent refusal (the node can never run this spec): Failed.
        """
        if self.nodes is None:
            return record
        try:
            return await self.nodes.admit(node.address, record)
        except InvalidInputError as exc:
            if exc.field not in _NOT_THE_SPECS_FAULT:
                return await self._fail_pending(record, f"node refused: {exc}")
            reason = str(exc)
        except (UnavailableError, UncertainOutcomeError) as exc:
            if NOT_ADMITTING not in str(exc):
                log.warning("node did not take %s yet: %s", record.id, exc, extra={"env_id": record.id})
                return record
            reason = str(exc)
        except AdxError as exc:
            # e.g. ConflictError "not admitting" from a node of an earlier version: a passing state of the node.
            reason = str(exc)
        log.warning("node %s refused %s: %s", node.name, record.id, reason, extra={"env_id": record.id})
        self._hold_admission(node.name)
        if await self._retire_unstarted(record, idempotency):
            refused.append(Refusal(node.name, f"{NOT_ADMITTING} ({reason})"))
            return None
        return self.cache.environments.get(record.id, record)

    async def _fail_pending(self, record: EnvironmentRecord, reason: str) -> EnvironmentRecord:
        latest = self.cache.environments.get(record.id, record)
        if latest.state is not EnvironmentState.PENDING:
            return latest
        failed = await self.store.commit_environment(
            latest, {"state": EnvironmentState.FAILED, "last_error": reason}, release_reservation=True
        )
        self.cache.apply(failed)
        return failed

    def _hold_admission(self, name: str) -> None:
        """Placement skips a node that just refused for a passing reason until its next report (c of issue 12):
        the Coordinator's view of its admission was stale."""
        known = self.cache.nodes.get(name)
        if known is not None and known.admission_open:
            self.cache.nodes[name] = known.model_copy(update={"admission_open": False})

    async def _retire_unstarted(
        self, record: EnvironmentRecord, idempotency: str | None, *, cached: bool = True
    ) -> bool:
        """True when nothing of ``record`` remains (retired now, or never stored). ``cached``: the record is in
        the caches (handed to a node), so an uncertain retire must make its node's catalog wait for a reload."""
        try:
            retired = await retire_unstarted_environment(self.store, record, idempotency=idempotency)
        except UncertainOutcomeError as exc:
            log.warning("retiring %s: %s", record.id, exc, extra={"env_id": record.id})
            if cached:
                self.cache.invalidate(record.id, record.node)  # CRD-2: the catalog waits for a reload
            return False
        except UnavailableError as exc:
            # It stays Pending: the node starts it from its catalog once it admits again (NOD-3).
            log.warning("retiring %s: %s", record.id, exc, extra={"env_id": record.id})
            return False
        if retired is False:
            # A node moved it past pending meanwhile: it is a real Environment; take the authority's version.
            with contextlib.suppress(AdxError):
                self.cache.apply(await self.store.get_environment(record.id))
            return False
        self.cache.apply(record.model_copy(update={"state": EnvironmentState.DELETED, "revision": record.revision + 1}))
        log.info("unstarted environment retired", extra={"env_id": record.id, "node": record.node})
        return True

    async def _settle_uncertain_create(
        self, record: EnvironmentRecord, idempotency: str | None, exc: UncertainOutcomeError
    ) -> None:
        """Redis may or may not have stored the create. The record was never cached nor handed to a node, so no
        node starts it; retiring it (now, or in the background once Redis answers) makes "nothing was created"
        true, and the caller gets a retryable NotAdmitting rather than an uncertain outcome."""
        log.warning("create of %s uncertain: %s", record.id, exc, extra={"env_id": record.id})
        if not await self._retire_unstarted(record, idempotency, cached=False):
            self._unsettled[record.id] = (record, idempotency)
            task = asyncio.create_task(self._settle_later(record.id), name=f"settle-{record.id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        raise NotAdmitting(
            f"the Coordinator could not store the Environment ({exc}); nothing was created, retry shortly",
            details={"retry_after_seconds": CREATE_RETRY_SECONDS},
        )

    async def _settle_later(self, env_id: str, *, within: float = 600.0) -> None:
        deadline = time.monotonic() + within
        retry_delay = Backoff(0.2, 5.0)
        while env_id in self._unsettled and time.monotonic() < deadline:
            await retry_delay.sleep()
            record, idempotency = self._unsettled[env_id]
            if await self._retire_unstarted(record, idempotency, cached=False):
                self._unsettled.pop(env_id, None)
            elif env_id in self.cache.environments:
                # Started after all (a reload found it and a node took it): a real Environment now.
                self._unsettled.pop(env_id, None)
