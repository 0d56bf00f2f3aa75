"""The adxlet's barriers (NOD-1, NOD-6, JRN-6): what runs before lifecycle operations and admission open, at
startup and after an explicit session rejection.

Order at startup: wait for the Coordinator's full catalog (however long), replay the degradation journal,
read the catalog again, clean executions no committed record references (their files are the persisted
cleanup records, NOD-13), take over what the runtime's inventory holds without a file here (adopted when the
catalog references it, cleaned when not: NOD-1, NOD-18), recover each Environment on its own (one failing
restricts only it, NOD-20), and sweep unreferenced checkpoints (NOD-15).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import TYPE_CHECKING

from adx._backoff import Backoff
from adx.errors import AdxError, NotFoundError, UnavailableError, UncertainOutcomeError
from adx.model import EnvironmentRecord, EnvironmentState
from adx.node._journal import DegradationJournal, PendingResult
from adx.node._operations import Delete, Exited, Resume, Step
from adx.node._replay import ReplayEnd, ReplayOutcome, done_by, dropped_checkpoints, replay
from adx.runtime import Execution, ExecutionState, ExitInfo, InventoryItem

if TYPE_CHECKING:
    from adx.config._node import NodeConfig
    from adx.node._controller import CheckpointPlaces, Controller
    from adx.node._coordinator_client import CoordinatorSink
    from adx.node._executions import ExecutionFiles
    from adx.node._reporter import Reporter
    from adx.runtime._sandboxd import SandboxdDriver

log = logging.getLogger("adx.node")
S = EnvironmentState


class Recovery:
    """The barrier steps of :class:`adx.node._agent.NodeAgent` (a mixin: the state it uses is the agent's)."""

    name: str
    config: NodeConfig
    driver: SandboxdDriver
    reporter: Reporter
    sink: CoordinatorSink
    executions: ExecutionFiles
    controllers: dict[str, Controller]
    journal: DegradationJournal
    places: CheckpointPlaces
    stop_event: asyncio.Event
    unaddressable: list[InventoryItem]
    _orphans: dict[str, Execution]
    _journaled_at_start: list[PendingResult]
    # Replays of the startup barrier the Coordinator refused while keeping the ownership here: each waits for
    # its Environment's recovery to hand it to the Controller (NOD-10).
    _dropped_at_start: dict[str, ReplayOutcome]
    # The checkpoints of the dropped results handed to Controllers: kept from the sweep (their Controller
    # decides).
    _converging: set[str]
    _tasks: list[asyncio.Task[None]]

    def _controller(self, record: EnvironmentRecord, execution: Execution | None = None) -> Controller:
        raise NotImplementedError

    async def _register_and_recover(self) -> None:
        catalog = await self._wait_for_catalog()
        self._warn_if_journal_missing(catalog)
        if self._journaled_at_start:
            # JRN-6: replay what the journal holds (matching ownership and spec, newer versions only), then read
            # the catalog again; only then reconcile with the runtime and open lifecycle and admission.
            await self._replay_at_start(catalog)
            catalog = await self._wait_for_catalog(with_references=True)
        known = await self._reconcile_runtime(catalog)
        await self._recover_catalog(catalog, known)
        await self._sweep_checkpoints()

    async def _reconcile_runtime(self, catalog: list[EnvironmentRecord]) -> dict[str, Execution]:
        """NOD-1: the executions of the catalog this node can address (adopted below), after cleaning the
        unreferenced ones and taking over those the runtime holds without a file here."""
        # Recorded before every start or restore (its planned address), so the files cover what an interrupted
        # launch left in the runtime too; read once for both steps.
        files = {execution.execution_id: execution for execution in self.executions.load_all()}
        known = await self._clean_unreferenced(catalog, files)
        await self._take_over_unaddressable(catalog, known, set(files))
        return known

    async def _recover_catalog(self, catalog: list[EnvironmentRecord], known: dict[str, Execution]) -> None:
        """Recover each Environment of the catalog no Controller holds yet, one by one."""
        blocked = self._orphan_envs() | {item.env_id for item in self.unaddressable}
        for record in catalog:
            if record.id in self.controllers or record.id in blocked:
                # RST-5/NOD-13: nothing of it starts until the old execution's cleanup is confirmed (or, for an
                # execution the runtime holds that this node cannot address yet, until it is taken over).
                continue
            await self._recover_one(record, known.get(record.execution_id or ""))

    async def _recover_one(self, record: EnvironmentRecord, execution: Execution | None) -> None:
        """NOD-20: one Environment's recovery failing restricts that Environment only, never the node's start."""
        try:
            await self._recover(record, execution)
        except AdxError as exc:
            log.error(
                "recovery of %s failed: %s; only it waits for the next routine check",
                record.id,
                exc,
                extra={"node": self.name, "env_id": record.id, "execution_id": record.execution_id},
            )
            controller = self.controllers.get(record.id)
            if controller is not None:
                controller.restricted = True

    async def _clean_unreferenced(
        self, catalog: list[EnvironmentRecord], files: dict[str, Execution]
    ) -> dict[str, Execution]:
        """CRD-7/NOD-13: executions no committed record references (a start or restore cut short before its
        commit) are cleaned before any Controller resumes or starts anything; the catalog was read fully.

        The execution's file is its persisted cleanup record: it is forgotten only once the runtime confirmed
        the cleanup, and until then that Environment admits nothing here (retried every report period)."""
        referenced = {record.execution_id for record in catalog if record.execution_id}
        for execution_id, execution in files.items():
            if execution_id not in referenced and execution.env_id not in self.controllers:
                self._orphans[execution_id] = execution
        await self._retry_orphans()
        return {k: v for k, v in files.items() if k not in self._orphans and k in referenced}

    async def _retry_orphans(self) -> None:
        for execution_id, execution in list(self._orphans.items()):
            try:
                await self.driver.stop(execution)
            except NotFoundError:
                pass
            except AdxError as exc:
                log.warning(
                    "cleanup of an ownerless execution not confirmed: %s; its Environment admits nothing here until "
                    "it is",
                    exc,
                    extra={"node": self.name, "env_id": execution.env_id, "execution_id": execution_id},
                )
                continue
            self.executions.forget(execution_id)
            del self._orphans[execution_id]
            log.info(
                "ownerless execution cleaned",
                extra={"node": self.name, "env_id": execution.env_id, "execution_id": execution_id},
            )

    def _orphan_envs(self) -> set[str]:
        return {execution.env_id for execution in self._orphans.values()}

    async def _take_over_unaddressable(
        self, catalog: list[EnvironmentRecord], known: dict[str, Execution], with_files: set[str]
    ) -> None:
        """NOD-1/NOD-18: what the runtime's inventory holds for this node without an execution file here (the
        file was lost, e.g. with a damaged state directory) is taken over with a new secret (the runtime's
        owner-level Reclaim; the old secret stops working) and its file written first. Then it is adopted
        when a committed record references it (``known`` gains it), else cleaned like any ownerless execution.
        An unavailable inventory or a failed take-over deletes nothing: that Environment waits (it is left in
        ``unaddressable`` and admits nothing here) and the next barrier tries again."""
        try:
            inventory = await self.driver.inventory()
        except AdxError as exc:
            log.warning("runtime inventory unavailable: %s", exc, extra={"node": self.name})
            return
        referenced = {record.execution_id: record for record in catalog if record.execution_id}
        addressable = with_files | set(self._orphans)
        self.unaddressable = []
        for item in inventory:
            if item.execution_id in addressable:
                continue
            context = {"node": self.name, "env_id": item.env_id, "execution_id": item.execution_id}
            try:
                execution = await self._reclaim(item)
            except NotFoundError:
                continue  # gone meanwhile: nothing to take over
            except AdxError as exc:
                log.error("an execution without a file here could not be taken over: %s", exc, extra=context)
                self.unaddressable.append(item)
                continue
            record = referenced.get(item.execution_id)
            if record is not None and record.id == item.env_id:
                known[item.execution_id] = execution
                log.warning("an execution whose file was lost is adopted under a new secret", extra=context)
            else:
                self._orphans[item.execution_id] = execution
                log.warning("an ownerless execution without a file is cleaned", extra=context)
        await self._retry_orphans()

    async def _reclaim(self, item: InventoryItem) -> Execution:
        """The runtime's Reclaim with one new secret, retried with that same secret while its outcome is
        unknown (a retry converges); the execution's file is written before anything else uses it."""
        secret = secrets.token_urlsafe(32)
        for attempt in range(5):
            try:
                execution = await self.driver.reclaim(item, secret)
                break
            except (UnavailableError, UncertainOutcomeError):
                if attempt == 4:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)
        self.executions.save(execution)
        return execution

    async def _wait_for_catalog(self, *, with_references: bool = True) -> list[EnvironmentRecord]:
        """Register and read the full catalog, however long the Coordinator takes (JRN-7: nothing is touched
        meanwhile, and no failure is ever read as an empty catalog)."""
        while True:
            await self.reporter.report_once()
            if self.reporter.state.registered:
                try:
                    return await self.sink.catalog(with_references=with_references)
                except AdxError as exc:
                    log.warning("catalog not available yet: %s", exc, extra={"node": self.name})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), min(self.config.report_interval_seconds, 1.0))
            if self.stop_event.is_set():
                raise UnavailableError("node stopped before the Coordinator's catalog could be read")

    async def _replay_at_start(self, catalog: list[EnvironmentRecord]) -> None:
        by_env: dict[str, list[PendingResult]] = {}
        for entry in self._journaled_at_start:
            by_env.setdefault(entry.env_id, []).append(entry)
        records = {record.id: record for record in catalog}
        for env_id, entries in by_env.items():
            record = records.get(env_id)
            # Committed entries (results the catalog already shows: an uncertain commit had landed) are removed;
            # the rest must match ownership and spec, which replay() checks against the authority on any
            # conflict. Never judged by revision alone: a change the Coordinator took meanwhile (a delete, a new
            # spec) holds the revision the first entry expected, and the next entry committed on top of it would
            # overwrite that change (a `deleting` record made `paused`).
            stale = done_by(record, entries)
            if stale:
                await self.journal.remove([e.seq for e in stale])
            entries = [e for e in entries if e not in stale]
            if not entries:
                continue
            if record is None or record.generation != entries[0].generation:
                log.warning(
                    "journaled results of a retired ownership dropped",
                    extra={"node": self.name, "env_id": env_id, "dropped": len(entries)},
                )
                await self.journal.remove([e.seq for e in entries])
                continue
            while entries:
                outcome = await replay(self.journal, self.sink, self.name, entries, self.sink.fetch)
                if outcome.end is ReplayEnd.DROPPED:
                    self._keep_for_convergence(outcome)
                if outcome.end is not ReplayEnd.PAUSED:
                    break
                log.warning("journal replay waits for the Coordinator: %s", outcome.reasons, extra={"env_id": env_id})
                await asyncio.sleep(min(self.config.report_interval_seconds, 1.0))
                entries = await self.journal.pending(env_id)
        self._journaled_at_start = []

    def _keep_for_convergence(self, outcome: ReplayOutcome) -> None:
        """NOD-10/NOD-11 at startup: results the Coordinator refused for good still did something here (a pause's
        checkpoint holds the files of an execution that is gone). When the authority keeps the ownership here,
        the Environment's Controller converges to it as at runtime (``_recover``); until then no sweep deletes
        those checkpoints. Any other answer leaves them to the sweep: nothing of this ownership is left."""
        authority = outcome.authority
        if authority is None or authority.node != self.name or not outcome.dropped_entries:
            return
        if authority.generation != outcome.dropped_entries[0].generation:
            return
        self._dropped_at_start[authority.id] = outcome

    def _warn_if_journal_missing(self, catalog: list[EnvironmentRecord]) -> None:
        """JRN-8: the configured journal was deleted while it held results (its marker outlived it): they are
        lost; say which Environments the Coordinator shows half-done on this node."""
        if not self.journal.lost:
            return
        unfinished = [r.id for r in catalog if r.state in (S.PAUSING, S.DELETING, S.RESUMING, S.STARTING)]
        log.warning(
            "the degradation journal %s was deleted while it held unpublished results; they are lost "
            "(Environments the Coordinator shows unfinished here: %s)",
            self.journal.path,
            ", ".join(sorted(unfinished)) or "none",
            extra={"node": self.name},
        )

    async def _sweep_checkpoints(self) -> None:
        """NOD-15, inside the startup barrier: delete the artifacts this node's runtime captured that no
        Environment of the cluster references (a pause interrupted between capture and commit leaves one).

        Only whole artifacts of our own runtime are listed, so another node's capture in flight on shared
        storage is never touched; retired ones are left to the confirmed deletion of CRD-9."""
        if self.sink.referenced_checkpoints is None:
            log.warning("checkpoint sweep skipped: the Coordinator sent no reference list", extra={"node": self.name})
            return
        referenced = self.sink.referenced_checkpoints | {ref.id for ref in self.sink.retired_checkpoints}
        # A dropped result's checkpoint is its Controller's to keep (published again) or delete (Step.CONVERGE);
        # that may not have run yet, and the reference list predates it.
        referenced |= {ref.id for outcome in self._dropped_at_start.values() for ref in dropped_checkpoints(outcome)}
        referenced |= self._converging
        storages = ["local"] if self.places.shared_root is None else ["local", self.places.shared_root]
        for storage in storages:
            try:
                artifacts = await self.driver.list_checkpoints(storage)
            except AdxError as exc:
                log.warning("checkpoint sweep of %s skipped: %s", storage, exc, extra={"node": self.name})
                continue
            for artifact in artifacts:
                if artifact.checkpoint_id in referenced:
                    continue
                try:
                    await self.driver.delete_checkpoint(artifact.location, artifact.digest)
                except AdxError as exc:
                    log.warning(
                        "unreferenced checkpoint %s not deleted: %s",
                        artifact.checkpoint_id,
                        exc,
                        extra={"node": self.name},
                    )
                    continue
                log.info(
                    "unreferenced checkpoint deleted",
                    extra={"node": self.name, "checkpoint_id": artifact.checkpoint_id, "storage": storage},
                )

    async def _recover(self, record: EnvironmentRecord, execution: Execution | None) -> None:
        dropped = self._dropped_at_start.get(record.id)
        if dropped is not None and execution is None and not await self._execution_absent(record):
            # The record names an execution this node has no file for and the runtime's inventory could not
            # rule out: deciding now (a pause published again, the exit flow) could be wrong; nothing is
            # touched, and the routine check (a missing Controller) recovers it again.
            return
        controller = self._controller(record, execution)
        if dropped is not None:
            del self._dropped_at_start[record.id]
            self._converging |= {ref.id for ref in dropped_checkpoints(dropped)}
            # Queued first: the state's own recovery below (a delete, an adoption) acts on the adopted record.
            controller.adopt_startup_drop(dropped, record)
        if record.state is S.PENDING:
            controller.submit(Step.START)
        elif record.state is S.DELETING:
            controller.submit(Delete())
        elif record.state is S.FAILED and record.restart_pending:
            controller.schedule_pending_restart()  # RST-3: the counters came back with the record
        elif record.state is S.RESUMING:
            controller.submit(Resume())  # a half-done restore left nothing referenced: it was cleaned above
        elif record.state is S.STARTING and execution is None:
            controller.submit(Step.CONTINUE_START)
        elif record.state in (S.RUNNING, S.STARTING, S.PAUSING) and execution is not None:
            if execution.execd_socket is None and record.state is S.STARTING:
                # Only planned: the node stopped while the runtime was creating it. A crash of the node is not a
                # failed start: the same create (same execution ID and secret, so the runtime returns what it
                # made, never a second one) goes on; a real failure of it fails the start as usual (RST-7).
                controller.submit(Step.CONTINUE_START)
                return
            if execution.execd_socket is None:
                # Only planned, under any other state: whatever the call made is cleaned by the exit flow.
                info = ExitInfo(reason="the node stopped while the execution was starting")
                controller.submit(Exited(execution.execution_id, info))
                return
            state = await self.driver.observe(execution)
            if state is ExecutionState.UNKNOWN:
                # SBX-6: a runtime that does not answer (restarting) is no evidence of an exit: this Environment
                # is decided once it answers, on its own task, without holding up the others or the barrier.
                log.warning(
                    "the runtime does not answer about %s yet; it is recovered once it does",
                    execution.execution_id,
                    extra={"node": self.name, "env_id": record.id, "execution_id": execution.execution_id},
                )
                self._tasks.append(
                    asyncio.create_task(self._recover_when_known(record, execution), name=f"recover-{record.id}")
                )
                return
            if state is ExecutionState.PAUSED or (state is ExecutionState.RUNNING and record.state is S.PAUSING):
                controller.submit(Step.CANCEL_PAUSE)  # the pause was not published: the execution runs on
            elif state is ExecutionState.RUNNING and record.state is S.STARTING:
                controller.submit(Step.FINISH_START)  # it started; only its Running commit was cut short
            elif state is ExecutionState.RUNNING:
                controller.adopt_running()
            else:
                controller.submit(Exited(execution.execution_id, None))

    async def _execution_absent(self, record: EnvironmentRecord) -> bool:
        """True when the record names no execution, or the runtime's inventory (read now) does not hold it: a
        file-less execution it holds is taken over at a barrier first (NOD-1); an unreadable one decides
        nothing."""
        if record.execution_id is None:
            return True
        try:
            inventory = await self.driver.inventory()
        except AdxError as exc:
            log.warning(
                "runtime inventory unavailable: %s; %s waits for the next routine check",
                exc,
                record.id,
                extra={"node": self.name, "env_id": record.id, "execution_id": record.execution_id},
            )
            return False
        return all(item.execution_id != record.execution_id for item in inventory)

    async def _recover_when_known(self, record: EnvironmentRecord, execution: Execution) -> None:
        """Ask the runtime again (backoff 0.2-2 s) until it answers, then recover ``record`` as at startup, unless
        its Controller moved on meanwhile (another record or execution: that one decides)."""
        retry_delay = Backoff(0.2, 2.0)
        while not self.stop_event.is_set():
            await retry_delay.sleep()
            controller = self.controllers.get(record.id)
            current = controller.execution if controller is not None else None
            if controller is None or controller.record.revision != record.revision or current != execution:
                return
            if await self.driver.observe(execution) is not ExecutionState.UNKNOWN:
                await self._recover_one(controller.record, execution)
                return

    async def _retake(self, old_session: str) -> None:
        """NOD-6/NOD-1 after an explicit session rejection and a new handshake: with admission closed, drain
        what each Controller admitted, read the catalog, clean unreferenced executions and recover Environments
        no Controller holds; only then admission opens again."""
        log.warning(
            "the Coordinator rejected session %s: re-taking ownership under %s",
            old_session,
            self.reporter.state.session,
            extra={"node": self.name},
        )
        try:
            for controller in list(self.controllers.values()):
                await asyncio.wait_for(controller.drained(), self.config.report_interval_seconds * 10)
            catalog = await self.sink.catalog()
            await self._recover_catalog(catalog, await self._reconcile_runtime(catalog))
        except (AdxError, TimeoutError) as exc:
            log.warning("session re-take not finished, retried next round: %s", exc, extra={"node": self.name})
            return
        self.reporter.retaken()
        log.info("session re-taken: admission open", extra={"node": self.name, "session": self.reporter.state.session})
