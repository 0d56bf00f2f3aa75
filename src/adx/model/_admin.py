"""What the admin API answers: tenants and their keys, nodes, the cluster, a drain's progress. Shared by the
Coordinator (which computes them), the API server (which serves them over HTTP) and the CLI (which prints them)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from adx.model._base import ApiModel
from adx.model._resources import Resources

#: What every key's first characters say, so a key pasted in the wrong place is recognised at once.
TENANT_KEY_PREFIX = "adxk_"
ADMIN_KEY_PREFIX = "adxa_"


class IssuedKey(ApiModel):
    """A new key: shown once (only its hash is stored). ``owner`` is the tenant, or the admin's name."""

    owner: str
    key_id: str = Field(description="names the key in revoke/rotate; not a secret")
    api_key: str = Field(description="the secret; shown only in this answer")


class AdminIdentity(ApiModel):
    name: str
    key_id: str


class KeyInfo(ApiModel):
    id: str
    created_at: float


class TenantInfo(ApiModel):
    name: str
    created_at: float
    disabled: bool = False
    keys: list[KeyInfo] = Field(default_factory=list, description="the tenant's live keys (revoked ones are gone)")


class NodeHealth(StrEnum):
    READY = "ready"  # session alive and a valid capacity sample
    STALE = "stale"  # session alive, capacity sample expired: placement skips it
    LOST = "lost"  # session expired (no heartbeat within its TTL)


class NodeInfo(ApiModel):
    name: str
    address: str
    capacity: Resources
    reserved: Resources
    allocatable: Resources = Field(description="max(capacity - reserved, 0): what placement may still give")
    admission_open: bool
    admission_reason: str = ""
    cordoned: bool = False
    health: NodeHealth
    last_heartbeat_at: float = Field(description="unix time of the node's last heartbeat (0: never)")
    environments: dict[str, int] = Field(default_factory=dict, description="this node's Environments by state")
    checkpoint_capable: bool = False
    shared_storage: bool = False


class ClusterStatus(ApiModel):
    nodes: list[NodeInfo]
    environments: dict[str, int] = Field(description="every tenant's Environments by state")
    leader: str = Field(description="the active Coordinator replica that answered")
    served_at: float


class DrainStep(StrEnum):
    CORDONED = "cordoned"  # the node admits nothing new
    PAUSING = "pausing"
    PAUSED = "paused"  # checkpointed: resumes on another node on its next use
    KEPT = "kept"  # already paused (or not running anything): stays as it is
    FAILED = "failed"  # could not be paused; ``message`` says why; the drain goes on with the others
    DONE = "done"


class DrainEvent(ApiModel):
    node: str
    step: DrainStep
    environment_id: str = ""
    tenant: str = ""
    state: str = ""
    message: str = ""
