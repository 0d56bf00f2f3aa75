"""Committed records: what the Coordinator stores and serves (Environment and node)."""

from __future__ import annotations

from pydantic import Field

from adx.model._base import ApiModel
from adx.model._resources import Resources
from adx.model._spec import EnvironmentSpec
from adx.model._states import EnvironmentState


class CheckpointRef(ApiModel):
    """The checkpoint an Environment would resume from."""

    id: str
    kind: str = "filesystem"
    storage: str  # "local" or "shared"
    node: str  # the node that published it (where a local checkpoint lives)
    published_at: float
    expires_at: float | None  # None: retained forever
    digest: str


class EnvironmentRecord(ApiModel):
    """One Environment as committed in the Coordinator's store.

    ``revision`` increments on every committed change (compare-and-set); ``generation`` is the ownership
    epoch on a node and changes only when ownership moves (placement, resume elsewhere).
    """

    id: str
    tenant: str
    spec: EnvironmentSpec
    state: EnvironmentState
    node: str | None = None
    generation: int = Field(default=0, ge=0)
    revision: int = Field(default=0, ge=0)
    execution_id: str | None = None
    created_at: float
    updated_at: float
    restart_attempts: int = Field(default=0, ge=0)
    restart_pending: bool = False
    checkpoint: CheckpointRef | None = None
    last_error: str | None = None


class NodeRecord(ApiModel):
    """A node as the Coordinator knows it: identity, session, capacity sample and reservations."""

    name: str
    address: str  # where the node's gRPC service listens (host:port)
    relay_address: str = ""  # where its data-plane Relay listens
    session: str = ""  # the adxlet process session; a new process gets a new session
    session_expires_at: float = 0.0
    capacity: Resources = Field(default_factory=Resources)
    capacity_valid_until: float = 0.0  # RES-6: the sample's own validity
    admission_open: bool = False
    reserved: Resources = Field(default_factory=Resources)
    checkpoint_capable: bool = False
    shared_storage: bool = False
