"""The adxlet's convergence with the Coordinator's catalog (NOD-3): every report period the routine check
compares ownership, generation, state and revision with the catalog and converges each Environment through its
own queue (never scanning the runtime), forgets what is gone, and deletes the checkpoints the catalog retired
(CRD-9). A newer generation of an Environment held here takes over from the old one (NOD-12, RST-5).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from adx.errors import AdxError
from adx.model import EnvironmentRecord, EnvironmentState
from adx.node._operations import Adopt, After, Delete, Resume, SetNetwork, Step
from adx.node._recovery import Recovery
from adx.runtime import Execution

if TYPE_CHECKING:
    from adx.node._controller import Controller

log = logging.getLogger("adx.node")
S = EnvironmentState

#: How long a deleted Environment is remembered here (so a cached route hears "deleted", not "not here").
DELETED_MEMORY_SECONDS = 600.0


class CatalogConvergence(Recovery):
    """The routine check and generation take-over of :class:`adx.node._agent.NodeAgent` (a mixin over the
    barriers it reuses: the state it uses is the agent's)."""

    _deleted: dict[str, float]
    _closing: set[asyncio.Task[None]]

    async def _routine_check_logged(self) -> None:
        try:
            await self._routine_check()
        except AdxError as exc:
            log.warning("routine check failed: %s", exc, extra={"node": self.name})
        except Exception:
            log.exception("routine check crashed", extra={"node": self.name})

    async def _routine_check(self) -> None:
        """NOD-3: compare ownership, generation, state and revision with the catalog; converge through each
        Environment's own queue; never scan the runtime."""
        # NOD-5: the Controllers that exist before the catalog is read; one admitted meanwhile is not judged by
        # a catalog that predates it.
        known_before = {env_id: controller for env_id, controller in self.controllers.items()}
        try:
            catalog = await self.sink.catalog()
        except AdxError as exc:
            # NOD-6: a failed fetch is never an empty catalog; keep everything and retry next round.
            log.warning("routine check skipped: %s", exc, extra={"node": self.name})
            return
        owned = {record.id for record in catalog}
        await self._retry_orphans()
        restricted = self._orphan_envs()
        for record in catalog:
            controller = self.controllers.get(record.id)
            if record.id in restricted:
                continue  # NOD-13: until the old execution's cleanup is confirmed
            if controller is None:
                if record.id in self._dropped_at_start:
                    # Its startup replay was dropped and its recovery waited for the runtime's inventory: the
                    # recovery hands the dropped results to its Controller, whatever the state (NOD-10).
                    await self._recover_one(record, self.executions.get(record.execution_id or ""))
                elif record.state is S.PENDING:
                    # NOD-8/NOD-20: a placed Environment starts when this node admits; until then it waits.
                    if self.reporter.admission_open:
                        self._controller(record).submit(Step.START)
                elif record.state is S.DELETING:
                    self._controller(record).submit(Delete())
                elif record.state is S.RESUMING:
                    self._controller(record).submit(Resume(record))
                elif record.state is not S.DELETED and record.id not in self._deleted:
                    # NOD-20: a missing local Controller recovers only that instance, as at startup (adopted if
                    # its execution runs, through the exit flow if not); nothing else on the node waits.
                    log.warning(
                        "no Controller holds %s here; recovering it",
                        record.id,
                        extra={"node": self.name, "env_id": record.id, "execution_id": record.execution_id},
                    )
                    await self._recover_one(record, self.executions.get(record.execution_id or ""))
                continue
            if known_before.get(record.id) is not controller or controller.publication_pending:
                # NOD-5/NOD-9: admitted after the read, or a local result newer than the catalog: that one
                # publishes first (its replay re-checks only this Environment).
                continue
            if record.generation > controller.record.generation:
                # NOD-12: ownership moved on to a newer generation here; the old one is cleaned first.
                execution = self.executions.get(record.execution_id or "")
                self._take_over(controller, record, execution)
                await self._recover_one(record, execution)
                continue
            if record.generation < controller.record.generation:
                continue  # NOD-5: an old generation never overwrites a newer one
            if record.state is S.DELETING and controller.state is not S.DELETED and not controller.deletes_queued:
                # NOD-12: queued behind what this Controller admitted before; it adopts the record in its queue.
                # Also when the local record is newer (a Deleting record is final: a local result past it was
                # never stored) or already Deleting (an earlier delete was refused or failed): a delete the node
                # still holds is retried every round until it is done (NOD-11).
                controller.submit(Delete(record))
                continue
            if record.revision < controller.record.revision:
                continue  # NOD-5: an old catalog never overwrites a newer local state
            if (
                record.state is S.RESUMING
                and controller.state in (S.PAUSED, S.RESUMING)
                and record.revision > controller.record.revision
            ):
                controller.submit(Resume(record))  # a lost resume hand-over (CRD-5)
            elif (
                record.network_revision > controller.record.network_applied_revision
                and record.revision >= controller.record.revision
                and not controller.restricted
            ):
                # NOD-10: state and revision first: only a record at least as new changes the network policy in
                # place. The same revision counts: a commit of this node that met the newer policy adopted its
                # record without applying it (a policy stored while the sandbox was starting).
                controller.submit(SetNetwork(record))
            elif controller.restricted and record.revision >= controller.record.revision:
                controller.submit(Adopt(record))  # NOD-10: the authoritative check this one waits for
        now = time.monotonic()
        for env_id, controller in list(self.controllers.items()):
            if controller.publication_pending or controller.dropped is not None:
                # Its journaled results still have to reach the Coordinator, or what refused ones left (a
                # checkpoint) is still to be cleaned by its queued convergence, even behind a delete done first.
                continue
            gone = env_id not in owned and controller.state is S.PAUSED and controller.execution is None
            if controller.state is S.DELETED or gone or controller.retired:
                # ``gone``: a paused Environment deleted, expired or resumed elsewhere; nothing of it runs here.
                del self.controllers[env_id]
                await controller.close()
                self._deleted[env_id] = now
        for env_id, when in list(self._deleted.items()):
            if now - when > DELETED_MEMORY_SECONDS:
                del self._deleted[env_id]
        await self._delete_retired_checkpoints()

    async def _delete_retired_checkpoints(self) -> None:
        """CRD-9: delete artifacts the global catalog lists as unreferenced; a failure retries next round."""
        for ref in self.sink.retired_checkpoints:
            if ref.storage == "local" and ref.node != self.name:
                continue
            try:
                await self.driver.delete_checkpoint(self.places.locate(ref), ref.digest)
                await self.sink.confirm_checkpoint_deleted(ref.id)
            except AdxError as exc:
                log.warning("retired checkpoint %s not deleted yet: %s", ref.id, exc, extra={"node": self.name})
                continue
            log.info("retired checkpoint deleted", extra={"node": self.name, "checkpoint_id": ref.id})

    def _take_over(self, old: Controller, record: EnvironmentRecord, execution: Execution | None = None) -> Controller:
        """NOD-12/NOD-14: a newer generation of an Environment this node holds an older one of: the old
        Controller cleans its execution behind what it admitted, then refuses everything; the new one starts
        from the catalog's record and acts only after that cleanup (RST-5)."""
        log.warning(
            "generation %d replaces %d here",
            record.generation,
            old.record.generation,
            extra={"node": self.name, "env_id": record.id, "generation": record.generation},
        )
        revoked = old.submit(Step.REVOKE)
        self.controllers.pop(record.id, None)
        revoked.add_done_callback(lambda _: self._spawn_close(old))
        controller = self._controller(record, execution)
        controller.submit(After(revoked))
        return controller

    def _spawn_close(self, controller: Controller) -> None:
        task = asyncio.create_task(controller.close(), name=f"close-{controller.env_id}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
