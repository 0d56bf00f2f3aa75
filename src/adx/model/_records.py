"""Committed records: what the Coordinator stores and serves (Environment and node)."""

from __future__ import annotations

from typing import Literal, TypedDict

from pydantic import Field

from adx.model._base import ApiModel
from adx.model._resources import MAX_CPU_OVERCOMMIT, Resources, admission_limit, allocatable
from adx.model._spec import EnvironmentSpec
from adx.model._states import EnvironmentState


class CheckpointRef(ApiModel):
    """The checkpoint an Environment resumes from: its artifact's identity, place and retention."""

    id: str
    kind: str = "filesystem"
    storage: Literal["local", "shared"]
    node: str  # the node that published it (a local checkpoint can only be restored there)
    location: str  # the artifact directory as the runtime names it
    digest: str  # sha256 of the artifact's manifest: restore and delete must name it exactly
    size_bytes: int = Field(default=0, ge=0)
    published_at: float
    expires_at: float | None  # ENV-3: publication + TTL; None: retained forever


class ResumeIntent(ApiModel):
    """CRD-5: one resume in progress, shared by every caller (Ingress replicas, manual resume, retries)."""

    operation_id: str
    started_at: float
    # Nodes that refused this resume (capacity round): never asked again by the same intent.
    refused: list[str] = Field(default_factory=list)


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
    resume_intent: ResumeIntent | None = None
    # The lifetime deadline (``lifecycle.lifetime_seconds`` from creation, moved by set-lifetime).
    expires_at: float | None = None
    # CRD-6: the node that held this paused Environment is gone; the first demand resumes it elsewhere.
    ownership_lost: bool = False
    # CRD-10: a recovery from a lost node is under way (demand started it): a Paused meanwhile is that recovery's
    # intermediate state, not dormancy; it goes on by itself until the Environment runs somewhere.
    recovery_pending: bool = False
    last_error: str | None = None
    # NOD-10: the revision at which the Coordinator stored the spec's current network policy (SetNetwork), and
    # the one the owning node last applied and published; they differ while a change is on its way.
    network_revision: int = Field(default=0, ge=0)
    network_applied_revision: int = Field(default=0, ge=0)


class RecordChanges(TypedDict, total=False):
    """What one commit changes on an :class:`EnvironmentRecord` (field names, model values); the store sets
    ``revision`` and ``updated_at`` itself, and ``id``, ``tenant`` and ``created_at`` never change."""

    spec: EnvironmentSpec
    state: EnvironmentState
    node: str | None
    generation: int
    execution_id: str | None
    restart_attempts: int
    restart_pending: bool
    checkpoint: CheckpointRef | None
    resume_intent: ResumeIntent | None
    expires_at: float | None
    ownership_lost: bool
    recovery_pending: bool
    last_error: str | None
    network_revision: int
    network_applied_revision: int


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
    admission_reason: str = ""  # RES-7/RES-6: why the node admits nothing new ("" while it admits)
    devices: list[str] = Field(default_factory=list)  # RES-2/RES-8: whole-device IDs its resource source lists
    reserved: Resources = Field(default_factory=Resources)
    checkpoint_capable: bool = False
    shared_storage: bool = False
    cordoned: bool = False  # an admin closed its admission (``adx node cordon``) until it is uncordoned
    # RES-4: how far CPU reservations may exceed the CPU capacity (the node's ``cpu_overcommit``); memory and
    # disk are never overcommitted.
    cpu_overcommit: float = Field(default=1.0, ge=1.0, le=MAX_CPU_OVERCOMMIT)

    @property
    def limit(self) -> Resources:
        """What placement admits reservations up to: capacity with its CPU times ``cpu_overcommit``."""
        return admission_limit(self.capacity, self.cpu_overcommit)

    @property
    def cpu_limit_millis(self) -> int:
        return self.limit.cpu_millis

    @property
    def allocatable(self) -> Resources:
        """RES-4: ``max(limit - reserved, 0)``: what placement may still hand out on this node."""
        return allocatable(self.limit, self.reserved)
