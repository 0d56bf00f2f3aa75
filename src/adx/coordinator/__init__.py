"""The Coordinator: placement, ownership and persistence of Environments (Redis is its only authority)."""

from adx.coordinator._placement import Refusal, eligibility, rank_nodes
from adx.coordinator._store import CoordinatorStore, CreateOutcome, NoCapacity, SessionRejected

__all__ = [
    "CoordinatorStore",
    "CreateOutcome",
    "NoCapacity",
    "Refusal",
    "SessionRejected",
    "eligibility",
    "rank_nodes",
]
