"""Snapshots: a filesystem checkpoint of a running Environment, kept apart from the Environment's own record.

Shared by the Coordinator (which stores and retires them), the nodes (which capture and restore them) and the API
server (E2B's snapshot routes). No I/O here.
"""

from __future__ import annotations

from adx.model._base import ApiModel
from adx.model._records import CheckpointRef
from adx.model._spec import EnvironmentSpec

#: A snapshot's ID kind (``snap-<26 base32 chars>``).
SNAPSHOT = "snap"


class Snapshot(ApiModel):
    """One snapshot: its artifact (a catalogued checkpoint no Environment record retires) and what a new
    Environment made from it inherits (the source's image: the artifact is a layer over that image)."""

    id: str
    tenant: str
    name: str | None = None
    source_environment_id: str
    image: str
    checkpoint: CheckpointRef
    created_at: float
    #: The source's pause retention (ENV-3): TTL from publication, None for ``forever``.
    expires_at: float | None = None


def source_spec(snapshot: Snapshot, spec: EnvironmentSpec) -> EnvironmentSpec:
    """``spec`` for an Environment started from ``snapshot``: the snapshot's image, whatever ``spec`` named."""
    return spec.model_copy(update={"image": snapshot.image})
