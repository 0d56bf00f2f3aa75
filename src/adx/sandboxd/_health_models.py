"""What sandboxd reports about itself and its sandboxes' usage: Stats, the Resource report and Health."""

from __future__ import annotations

from pydantic import Field

from adx.sandboxd._sandbox_models import Resources, WireModel

__all__ = [
    "CgroupsInfo",
    "DeviceInfo",
    "Health",
    "ResourceInfo",
    "Stats",
    "WarmPoolInfo",
]


class Stats(WireModel):
    sandbox_id: str
    cpu_usage_ns: int
    memory_bytes: int
    memory_peak_bytes: int
    memory_cache_bytes: int = Field(default=0, description="page cache, part of memory_bytes")
    pids: int
    oom_kills: int
    disk_bytes: int = Field(description="bytes in the sandbox's writable layer (reported; not enforced on ext4)")
    observed_at: float


class DeviceInfo(WireModel):
    path: str
    dev: str  # "major:minor" of the whole device backing it


class ResourceInfo(WireModel):
    cpu_cores: int
    memory_bytes: int
    storage_bytes: int
    storage_free_bytes: int
    devices: list[DeviceInfo]
    device_ids: list[str] = Field(default_factory=list, description="whole-device IDs offered (RES-2)")
    capacity: Resources
    reserved: Resources
    sandboxes: int
    observed_at: float


class WarmPoolInfo(WireModel):
    """The warm pool (docs/sandboxd.md, 'Warm pool'): counters since sandboxd started."""

    size: int = Field(description="members kept per shape (0: off)")
    ready: int = Field(description="members ready to be claimed now")
    starting: int = Field(description="members being started (refill)")
    shapes: int = Field(description="shapes kept warm")
    claims: int = Field(description="creates that claimed a member")
    misses: int = Field(description="claimable creates that found none ready (started cold)")
    made: int = 0
    failed: int = 0
    dropped: int = Field(default=0, description="members destroyed unclaimed (shape evicted, capacity, stop)")


class CgroupsInfo(WireModel):
    """Where sandboxd found each cgroup controller (``_cgroups.CgroupLayout.describe``)."""

    v2_root: str | None
    controllers: dict[str, str | None] = Field(description="controller -> 'v1', 'v2' or null (missing)")


class Health(WireModel):
    ok: bool
    owner: str
    pid: int
    started_at: float
    storage_failed: bool
    spawner_alive: bool
    cgroups: CgroupsInfo
    resource_observed_at: float
    resource_age_seconds: float
    resource_fresh: bool
    resource_error: str | None = Field(default=None, description="why the last resource refresh failed (RES-8)")
    state_dir: str | None = Field(default=None, description="sandboxd's state directory (node disk pressure)")
    image_store: str | None = Field(default=None, description="its image store (where a node pulls images into)")
    deferred_errors: list[str]
    runtime_control_socket: str | None = Field(
        default=None, description="the node-level runtime-control subscription socket (CTL-2)"
    )
    artifact_roots: dict[str, str] = Field(
        default_factory=dict, description="checkpoint storage name -> its directory on this host"
    )
    user_namespace: bool = Field(
        default=False, description="sandboxes get a user namespace each (their root is not host root)"
    )
    user_namespace_note: str | None = Field(
        default=None, description="why user namespaces are off (configured off, or what this host lacks)"
    )
    disk_quota: bool = Field(
        default=False, description="disk requests limit each sandbox's writable layer (a btrfs pool: SEC-3)"
    )
    disk_quota_note: str | None = Field(
        default=None, description="why they are not (configured off, or what this host lacks for a pool)"
    )
    warm_pool: WarmPoolInfo | None = Field(default=None, description="pre-warmed sandboxes (issue 16)")
