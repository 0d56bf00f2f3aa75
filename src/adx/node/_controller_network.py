"""A network policy the Coordinator stored (NOD-10): applied in place to a running execution, or deferred."""

from __future__ import annotations

from adx.errors import AdxError, ConflictError
from adx.model import EnvironmentRecord
from adx.node._controller_commit import CommitSteps
from adx.node._controller_core import S, log


class NetworkSteps(CommitSteps):
    """Network policy updates (NOD-10)."""

    async def _set_network(self, incoming: EnvironmentRecord) -> EnvironmentRecord:
        """NOD-10: the Coordinator stored a new network policy (a mutable spec field). Only a record newer than
        ours with the same ownership, state and execution is taken, or ours when it holds a policy not applied
        yet; an old catalog copy is no conflict and changes nothing. A running execution gets the policy in
        place, then its revision is published; a paused one takes the record and gets the policy when it
        resumes."""
        if incoming.revision <= self.record.revision:
            # Ours is as new (a commit adopted the policy without applying it) or newer: it holds every policy
            # stored up to its revision, so apply from it and never go back to an older copy.
            incoming = self.record
        elif not self._same_ownership(incoming):
            return self.record
        if incoming.network_revision <= max(self.record.network_applied_revision, self.network_deferred_revision):
            return self.record
        previous, self.record = self.record, incoming
        execution = self.execution
        if self.state is not S.RUNNING or execution is None or incoming.spec.network is None:
            return self.record
        try:
            await self.driver.set_network(execution, incoming.spec.network)
        except ConflictError:
            # Not changeable in place (no veth): the record stays; the next start or resume applies it.
            self.network_deferred_revision = incoming.network_revision
            raise
        except AdxError:
            self.record = previous  # e.g. sandboxd unavailable: the next routine check tries again
            raise
        log.info("network policy applied", extra={**self._context(), "revision": incoming.network_revision})
        return await self._transition(S.RUNNING, {"network_applied_revision": incoming.network_revision})
