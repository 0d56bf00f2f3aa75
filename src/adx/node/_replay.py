"""Replaying journaled results to the Coordinator, in order (JRN-3, JRN-5, JRN-6).

One function serves both places that replay: a running Controller in its own queue once the Coordinator
answers again (NOD-17), and the startup barrier of a restarted adxlet before any Controller exists (JRN-6).

Each entry is the compare-and-set commit the Controller would have made. Replaying it is that commit; a
conflict is resolved against the authoritative record:
- the record already shows the entry's result (an uncertain commit had landed): the entry is done;
- the Coordinator changed only fields the node does not own (same ownership, state and execution as the
  entry's base, a newer revision): the entry is applied on top of that revision;
- the ownership is gone (deleted, another node, a newer generation) or the spec differs: the entry and every
  later one of that Environment can never apply and are dropped (JRN-6: retired ownership is cleared).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from adx.errors import (
    AdxError,
    ConflictError,
    NotFoundError,
    SessionRejectedError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.model import CheckpointRef, EnvironmentRecord, parse_wire
from adx.node._journal import DegradationJournal, PendingResult, spec_digest

log = logging.getLogger("adx.node.journal")


@dataclass(frozen=True)
class WireCommit:
    """One compare-and-set commit of ``changes`` (wire names) on the record's ``expected_revision`` of ownership
    ``expected_generation``, e.g. a journaled result being replayed."""

    env_id: str
    expected_revision: int
    expected_generation: int
    changes: dict[str, object]
    release_reservation: bool = False


class WireCommitter(Protocol):
    async def commit_wire(self, commit: WireCommit) -> EnvironmentRecord: ...


class ReplayEnd(enum.Enum):
    DONE = "done"  # every entry is committed (or found committed)
    PAUSED = "paused"  # the Coordinator became unavailable again: the rest stays journaled
    DROPPED = "dropped"  # ownership retired or conflicting: the rest was dropped


@dataclass
class ReplayOutcome:
    end: ReplayEnd
    #: The authority's record after the last committed entry (None if nothing was committed or found).
    record: EnvironmentRecord | None = None
    committed: int = 0
    dropped: int = 0
    remaining: int = 0
    reasons: list[str] = field(default_factory=list)
    #: DROPPED: the authority's record the entries were judged against (None: it no longer gives it to this
    #: node), and the entries dropped, whose results (a checkpoint, an execution) nothing published references.
    authority: EnvironmentRecord | None = None
    dropped_entries: list[PendingResult] = field(default_factory=list)


async def replay(
    journal: DegradationJournal,
    sink: WireCommitter,
    node: str,
    entries: list[PendingResult],
    latest: Callable[[str], Awaitable[EnvironmentRecord | None]],
) -> ReplayOutcome:
    """Replay one Environment's ``entries`` (ordered by sequence) and forget those that are done.

    Raises SessionRejectedError (after forgetting what is done) when the Coordinator refused the node's session:
    the node registers again and the rest stays journaled for the next replay (NOD-6)."""
    outcome = ReplayOutcome(ReplayEnd.DONE)
    finished: list[int] = []
    index = 0
    try:
        while index < len(entries):
            entry = entries[index]
            try:
                outcome.record = await _commit(sink, entry, entry.base_revision)
                done = [entry]
            except SessionRejectedError:
                # NOD-6: a refused session (expired, or replaced while this commit was in flight) says nothing of
                # the entry; judged as a conflict against a record read under the new session, the authority
                # still showing the entry's base read as "conflict" and dropped every entry for good.
                raise
            except (ConflictError, NotFoundError) as exc:
                current = await latest(entry.env_id)
                landed = done_by(current, entries[index:])
                verdict = _resolve(entry, current, node)
                if landed:
                    # Uncertain commits had landed: every entry up to the one the record shows is done.
                    outcome.record, done = current, landed
                elif verdict == "rebase":
                    assert current is not None
                    outcome.record = await _commit(sink, entry, current.revision)
                    done = [entry]
                else:
                    rest = entries[index:]
                    finished.extend(e.seq for e in rest)
                    outcome.dropped = len(rest)
                    outcome.end = ReplayEnd.DROPPED
                    outcome.authority, outcome.dropped_entries = current, rest
                    outcome.reasons.append(f"{entry.env_id} entry {entry.seq}: {verdict} ({exc})")
                    log.error(
                        "journaled results dropped: %s",
                        verdict,
                        extra={
                            "env_id": entry.env_id,
                            "generation": entry.generation,
                            "execution_id": entry.execution_id,
                            "dropped": len(rest),
                        },
                    )
                    break
            for item in done:
                finished.append(item.seq)
                outcome.committed += 1
                log.info(
                    "journaled result replayed",
                    extra={
                        "env_id": item.env_id,
                        "generation": item.generation,
                        "execution_id": item.execution_id,
                        "state": item.state.value,
                        "revision": item.revision,
                    },
                )
            index += len(done)
    except (UnavailableError, UncertainOutcomeError) as exc:
        outcome.end = ReplayEnd.PAUSED
        outcome.reasons.append(str(exc))
    finally:
        if finished:
            await journal.remove(finished)
    outcome.remaining = len(entries) - len(finished)
    return outcome


def done_by(current: EnvironmentRecord | None, entries: list[PendingResult]) -> list[PendingResult]:
    """The leading entries the authority already holds: up to the latest one whose result it shows (same
    generation, state, execution and spec, at that entry's revision or past it: the Coordinator may have changed
    fields the node does not own since, e.g. a lifetime deadline). A revision alone says nothing: the
    Coordinator's own change (a delete, a new spec) takes the revision the first entry expected to commit."""
    if current is None:
        return []
    digest = spec_digest(current.spec)
    for position in range(len(entries) - 1, -1, -1):
        entry = entries[position]
        if (current.generation, current.state, current.execution_id, digest) == (
            entry.generation,
            entry.state,
            entry.execution_id,
            entry.spec_digest,
        ) and current.revision >= entry.revision:
            return entries[: position + 1]
    return []


def dropped_checkpoints(outcome: ReplayOutcome) -> tuple[CheckpointRef, ...]:
    """The checkpoints the dropped entries referenced (a pause's, a workload checkpoint's): captured on this
    node, published nowhere."""
    refs = (entry.changes.get("checkpoint") for entry in outcome.dropped_entries)
    return tuple(CheckpointRef.model_validate(raw) for raw in refs if isinstance(raw, dict))


def led_to(base: EnvironmentRecord, entries: list[PendingResult]) -> EnvironmentRecord:
    """The record ``entries`` made of ``base`` on this node (each entry's changes merged in order, as the
    Coordinator merges a commit): what a dropped replay leaves real here, though no authority stored it."""
    record = base
    for entry in entries:
        merged = {**record.to_wire(), **entry.changes, "revision": entry.revision}
        record = parse_wire(EnvironmentRecord, merged)
    return record


async def _commit(sink: WireCommitter, entry: PendingResult, on_revision: int) -> EnvironmentRecord:
    return await sink.commit_wire(
        WireCommit(entry.env_id, on_revision, entry.generation, entry.changes, entry.release_reservation)
    )


def _resolve(entry: PendingResult, current: EnvironmentRecord | None, node: str) -> str:
    """ "rebase" (apply on the newer revision), or why the entry can never apply."""
    if current is None or current.node != node:
        return "ownership retired (the Environment is no longer this node's)"
    if current.generation != entry.generation:
        return f"ownership moved on (generation {current.generation}, entry {entry.generation})"
    if spec_digest(current.spec) != entry.spec_digest:
        return "the request spec changed"
    if current.revision > entry.base_revision and (current.state, current.execution_id) == (
        entry.base_state,
        entry.base_execution_id,
    ):
        return "rebase"
    return (
        f"conflict: the Coordinator holds {current.state.value}/{current.execution_id} at revision "
        f"{current.revision}, the entry expected {entry.base_state.value}/{entry.base_execution_id} at "
        f"{entry.base_revision}"
    )


def is_unpublished_error(exc: AdxError) -> bool:
    """Errors that mean "the Coordinator could not store it now" (JRN-2: the only ones that degrade)."""
    return isinstance(exc, (UnavailableError, UncertainOutcomeError))
