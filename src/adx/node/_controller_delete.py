"""The end of a Controller's ownership: an explicit delete (RST-4, CTL-6), and a revocation when a newer
generation takes the Environment over (NOD-12, RST-5).
"""

from __future__ import annotations

import asyncio
import contextlib

from adx.model import EnvironmentRecord
from adx.node._controller_core import S, log
from adx.node._controller_execution import ExecutionSteps


class DeleteSteps(ExecutionSteps):
    """Delete, revoke, and waiting for a revoked generation's cleanup."""

    async def _delete(self, incoming: EnvironmentRecord | None) -> EnvironmentRecord:
        if (
            incoming is not None
            and incoming.generation == self.record.generation
            and not self.publication_pending
            and (incoming.revision > self.record.revision or self._stale_against_delete(incoming))
        ):
            self.record = incoming  # NOD-12: the Coordinator's delete, adopted in order behind earlier operations
        if self.record.state is S.DELETED:
            return self.record
        self.serving = False
        if self._restart_timer is not None:
            self._restart_timer.cancel()  # RST-4: an explicit delete cancels a pending restart
        if self.record.state is not S.DELETING:
            await self._transition(S.DELETING)
        await self._publish_route()
        if self._exit_watch is not None:
            self._exit_watch.cancel()
        if self.execution is not None:
            await self._cleanup(self.execution)
            self.execution = None
        # CTL-6: the delete result is committed only after the runtime confirmed the cleanup.
        deleted = await self._transition(S.DELETED, release=True)
        self.closed = True
        return deleted

    def _stale_against_delete(self, incoming: EnvironmentRecord) -> bool:
        """A Deleting record of this generation is final (only Deleted follows it, and the Coordinator refuses
        any other commit on it): a local record that is not deleting, whatever its revision, is a result the
        Coordinator never stored (a dropped or refused one), never a reason to refuse its delete."""
        return incoming.state is S.DELETING and self.record.state not in (S.DELETING, S.DELETED)

    async def _revoke(self) -> EnvironmentRecord:
        """NOD-12: the Coordinator gave this Environment a newer generation: behind every operation admitted
        before, retire the routes and clean this generation's execution (confirmed), then refuse everything."""
        self.serving = False
        if self._restart_timer is not None:
            self._restart_timer.cancel()
        if self._exit_watch is not None:
            self._exit_watch.cancel()
        execution, self.execution = self.execution, None
        if execution is not None:
            await self._cleanup(execution)
        self.revoked = True
        log.info("generation revoked: its execution is cleaned", extra=self._context())
        return self.record

    async def _after(self, prior: asyncio.Future[EnvironmentRecord]) -> EnvironmentRecord:
        """Wait for another Controller's operation (the revoked generation's cleanup, RST-5) before going on."""
        with contextlib.suppress(Exception):
            await asyncio.shield(prior)
        return self.record
