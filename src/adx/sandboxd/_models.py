"""Typed wire and storage models of sandboxd (shared by the daemon and its client).

The API is JSON over HTTP/1.1 on a private Unix socket: ``POST /v1/<Call>`` with the request model as the
body; errors are ``{"error": {"code", "message", "details"}}`` with the ``adx.errors`` family's code.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from adx.execd import _options as execd_options
from adx.execd._launch import init_argv
from adx.model import NetworkPolicy
from adx.sandboxd._sandbox_layout import CONTROL_DIR_INSIDE, CONTROL_SOCKET, EXECD_ADMIN_SOCKET_FD, EXECD_SOCKET_FD
from adx.sandboxd._states import State

__all__ = [
    "ActivityObservation",
    "CheckpointInfo",
    "CheckpointRef",
    "CheckpointRequest",
    "CheckpointRequestObservation",
    "CommitLayerRequest",
    "CommitLayerResponse",
    "CreateRequest",
    "CreateResponse",
    "DeleteResponse",
    "ExecdOptions",
    "ExitStatus",
    "Health",
    "ListCheckpointsRequest",
    "ListCheckpointsResponse",
    "ListResponse",
    "NativeIdentity",
    "OutputResponse",
    "ProbeObservation",
    "ProbeOptions",
    "ReclaimRequest",
    "ReclaimResponse",
    "ResourceInfo",
    "ResourcesSpec",
    "RestoreRequest",
    "RuntimeObservation",
    "SandboxInfo",
    "SandboxRecord",
    "SandboxRef",
    "Stats",
    "StoredCheckpoint",
    "WaitRequest",
    "WaitResponse",
    "WarmPoolInfo",
]

SANDBOX_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
#: A log group names a directory under ``<state_dir>/logs``: no separators, no dot files.
LOG_GROUP_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
LogGroup = Annotated[str | None, Field(pattern=LOG_GROUP_PATTERN)]
_IMAGE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResourcesSpec(_Model):
    cpu_millis: int | None = Field(default=None, ge=10, le=1_000_000)
    memory_bytes: int | None = Field(default=None, ge=8 << 20)
    pids_max: int | None = Field(default=None, ge=8, le=4_194_304)
    disk_bytes: int | None = Field(default=None, ge=0)


class Resources(_Model):
    """Resolved resources of a sandbox (what is reserved and enforced)."""

    cpu_millis: int
    memory_bytes: int
    pids_max: int
    disk_bytes: int  # accounted against capacity; not enforced by overlayfs on ext4


class ProbeOptions(_Model):
    """execd's health probe of the workload: exactly one of ``command`` (exit 0 = healthy) or ``tcp_port``."""

    command: str | None = Field(default=None, min_length=1, max_length=4096)
    tcp_port: int | None = Field(default=None, ge=1, le=65535)
    interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    timeout_seconds: float = Field(default=2.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _one_kind(self) -> ProbeOptions:
        if (self.command is None) == (self.tcp_port is None):
            raise ValueError("give exactly one of command or tcp_port")
        return self


class ExecdOptions(_Model):
    """Run execd as the sandbox's PID 1; it starts ``CreateRequest.argv`` (if any) as the workload.

    sandboxd builds the init command line, mounts its execd runtime read-only at ``/opt/adx``, binds execd's
    client and admin sockets at host-only paths (``SandboxInfo.execd_socket`` / ``execd_admin_socket``) and
    hands PID 1 the listening descriptors; execd reports to sandboxd's runtime-control hub.
    """

    python: str = Field(default="python3", min_length=1, description="interpreter inside the sandbox")
    execution_id: str | None = Field(default=None, max_length=200, description="sent in execd's control hello")
    exit_with_workload: bool = Field(
        default=True, description="with a workload: execd (the sandbox) exits with it; else execd keeps serving"
    )
    probe: ProbeOptions | None = None
    grace_seconds: float = Field(default=5.0, ge=0, le=3600, description="SIGTERM -> SIGKILL at execd's exit")

    def init_argv(self, sandbox_id: str, workload: list[str], user: str | None) -> list[str]:
        """PID 1's argv: execd on the descriptors and control socket sandboxd prepares (``_sandbox_layout``)."""
        probe = self.probe
        options = execd_options.ExecdOptions(
            socket_fd=EXECD_SOCKET_FD,
            admin_socket_fd=EXECD_ADMIN_SOCKET_FD,
            control_socket=f"{CONTROL_DIR_INSIDE}/{CONTROL_SOCKET}",
            sandbox_id=sandbox_id,
            execution_id=self.execution_id,
            workload=tuple(workload),
            user=user,
            # without a workload there is nothing to exit with
            exit_with_workload=bool(workload) and self.exit_with_workload,
            probe_command=None if probe is None else probe.command,
            probe_tcp_port=None if probe is None else probe.tcp_port,
            probe_interval=5.0 if probe is None else probe.interval_seconds,
            probe_timeout=2.0 if probe is None else probe.timeout_seconds,
            grace_seconds=self.grace_seconds,
            unset_env=("PYTHONPATH",),  # execd's modules: not the workload's business
        )
        return init_argv(options, python=self.python)


class NativeIdentity(_Model):
    """Written by the supervisor before the workload starts; binds the record to this boot's cgroup (SBX-5)."""

    boot_id: str
    cgroup_dev: int
    cgroup_ino: int
    cgroup_dir: str
    created_at: float


class ExitStatus(_Model):
    exit_code: int | None = None
    signal: int | None = None
    oom_killed: bool = False
    oom_kills: int = 0
    setup_failed: bool = False
    finished_at: float | None = None
    boot_id: str | None = None
    known: bool = True  # False: the workload is gone but no supervisor recorded how it ended


def _check_volume_binds(value: dict[str, str]) -> dict[str, str]:
    for inside, host in value.items():
        if not inside.startswith("/") or inside == "/" or not host.startswith("/"):
            raise ValueError(f"{inside!r} -> {host!r}: both must be absolute paths (not / inside)")
    return value


#: Volumes bound read-write into a sandbox (its mount point inside -> the host directory), idmapped with a user
#: namespace so the files' on-disk IDs are the sandbox's own (docs/volumes.md).
VolumeBinds = Annotated[dict[str, str], AfterValidator(_check_volume_binds), Field(max_length=64)]


class SandboxRecord(_Model):
    """One persisted sandbox (``sandboxes/<id>/record.json``, inside an owner envelope)."""

    sandbox_id: str
    generation: int
    token: str
    state: State
    request_id: str
    request_digest: str
    argv: list[str]
    init_argv: list[str]
    env: dict[str, str]
    cwd: str
    network: Literal["none", "host", "veth"]
    resources: Resources
    metadata: dict[str, str]
    created_at: float
    updated_at: float
    expires_at: float | None = None
    native: NativeIdentity | None = None
    exit: ExitStatus | None = None
    reason: str | None = None
    restored_from: str | None = None
    net_index: int | None = Field(default=None, description="veth mode: the /30 of the node's pool in use")
    net_policy: NetworkPolicy | None = Field(default=None, description="veth mode: the egress policy in force")
    native_name: str | None = Field(
        default=None,
        description="a claimed warm pool member: the name its cgroup, veth and nftables chain were made under and "
        "keep (cgroup v2 refuses renames); None: the sandbox ID",
    )
    id_base: int | None = Field(
        default=None, description="user namespace: host uid/gid of the sandbox's root (65536 IDs from there)"
    )
    execd: ExecdOptions | None = None
    reclaimed_at: float | None = Field(
        default=None, description="when the owner last replaced the token (Reclaim); the create's token is void"
    )
    log_group: str | None = Field(default=None, description="where the workload's output is kept; None: the ID")
    image: str | None = Field(default=None, description="the image name asked for (None: the node's default)")
    image_layers: list[str] | None = Field(
        default=None, description="the store layers mounted, bottom first (None: the host-derived skeleton)"
    )
    image_user: str | None = Field(default=None, description="execd runs commands and the workload as this user")
    volumes: VolumeBinds = Field(default_factory=dict, description="mount point inside -> host dir, read-write")


#: A sandbox's secret chosen by the caller of Create or Restore, so a lost reply leaves the sandbox addressable
#: (default: generated by sandboxd).
TOKEN_PATTERN = r"^[A-Za-z0-9_-]+$"
CallerToken = Annotated[str | None, Field(min_length=32, max_length=128, pattern=TOKEN_PATTERN)]


class CreateRequest(_Model):
    request_id: str = Field(min_length=1, max_length=200, description="idempotency key")
    sandbox_id: str | None = Field(default=None, description="optional caller-chosen ID (never reused)")
    generation: int = Field(default=1, ge=1)
    token: CallerToken = None
    argv: list[str] = Field(
        default_factory=list, max_length=4096, description="the workload; may be empty only with execd"
    )
    init_argv: list[str] | None = Field(default=None, description="PID 1 of the sandbox; default argv")
    execd: ExecdOptions | None = Field(default=None, description="execd as PID 1 (then init_argv must be unset)")
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = Field(default=None, description="default: the image's workdir, else /work")
    resources: ResourcesSpec = ResourcesSpec()
    metadata: dict[str, str] = Field(default_factory=dict)
    ttl_seconds: float | None = Field(default=None, gt=0)
    network: Literal["none", "host", "veth"] | None = Field(
        default=None,
        description="none: private netns with lo only; veth: plus a veth pair with a private /30; host: shared",
    )
    network_policy: NetworkPolicy | None = Field(
        default=None,
        description="egress: a veth with this allow/deny policy (nftables); none: lo only; unset: the defaults",
    )
    log_group: LogGroup = Field(
        default=None,
        description="the workload's output is kept under this name (e.g. the Environment, across its executions); "
        "default: the sandbox ID",
    )
    volumes: VolumeBinds = Field(default_factory=dict, description="mount point inside -> host dir, read-write")
    image: str | None = Field(
        default=None,
        description="image of the image store (its env, workdir and user apply); unset or 'base': the node's default",
    )
    image_layers: list[str] | None = Field(
        default=None,
        max_length=128,
        description="explicit store layers, bottom first, instead of a named image (image builds, restores)",
    )

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE_NAME_RE.match(value):
            raise ValueError("must be 1-63 lowercase letters, digits, '.', '_' or '-'")
        return value

    @field_validator("image_layers")
    @classmethod
    def _layers(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not all(_DIGEST_RE.match(d) for d in value):
            raise ValueError("must be sha256 hex digests of store layers")
        return value

    @field_validator("sandbox_id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        if value is not None and not SANDBOX_ID_RE.match(value):
            raise ValueError("must match ^[a-z0-9][a-z0-9-]{0,62}$")
        return value

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return value

    @field_validator("argv", "init_argv")
    @classmethod
    def _argv(cls, value: list[str] | None) -> list[str] | None:
        if value and (not value[0] or any("\0" in a for a in value)):
            raise ValueError("must be a non-empty list of strings without NUL bytes")
        return value

    @model_validator(mode="after")
    def _init(self) -> CreateRequest:
        if self.execd is not None and self.init_argv is not None:
            raise ValueError("init_argv: give either execd or init_argv, not both")
        if self.execd is None and not self.argv:
            raise ValueError("argv: must be a non-empty list of strings (only an execd sandbox may omit it)")
        if self.init_argv is not None and not self.init_argv:
            raise ValueError("init_argv: must be a non-empty list of strings")
        return self


class SetNetworkRequest(_Model):
    """Replace a running veth sandbox's egress policy in place (one nft transaction)."""

    sandbox_id: str
    generation: int
    token: str
    owner: str | None = None
    policy: NetworkPolicy

    @property
    def ref(self) -> SandboxRef:
        return SandboxRef(sandbox_id=self.sandbox_id, generation=self.generation, token=self.token, owner=self.owner)


class SandboxRef(_Model):
    """Names one sandbox in a per-sandbox call: all four must match (SBX-4)."""

    sandbox_id: str
    generation: int
    token: str
    owner: str | None = None


class CommitLayerRequest(_Model):
    """Turn an ended sandbox's writable (upper) layer into store layer ``digest`` (an image build step)."""

    ref: SandboxRef
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    parent: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    step: str = Field(max_length=1 << 16, description="the step text the digest covers")


class CommitLayerResponse(_Model):
    digest: str
    size_bytes: int


class OutputResponse(_Model):
    """The tail of what the sandbox's PID 1 wrote to stdout/stderr (sandboxes without execd)."""

    output: str
    truncated: bool


class SandboxInfo(_Model):
    sandbox_id: str
    generation: int
    owner: str
    state: State
    request_id: str
    argv: list[str]
    init_argv: list[str]
    cwd: str
    network: str
    resources: Resources
    metadata: dict[str, str]
    created_at: float
    updated_at: float
    expires_at: float | None
    native: NativeIdentity | None
    exit: ExitStatus | None
    reason: str | None
    restored_from: str | None
    run_dir: str = Field(description="host dir bind-mounted (writable) at /run/adx inside; never trust its contents")
    execd: ExecdOptions | None = None
    execd_socket: str | None = Field(
        default=None, description="execd sandboxes: host-only path of execd's client socket (never inside)"
    )
    execd_admin_socket: str | None = Field(
        default=None, description="execd sandboxes: host-only path of execd's admin socket (activity, admission)"
    )
    address: str | None = Field(default=None, description="veth mode: the sandbox's private IPv4 address")
    host_address: str | None = Field(default=None, description="veth mode: the host end's address")
    network_policy: NetworkPolicy | None = Field(default=None, description="veth mode: the egress policy in force")
    observation_error: str | None = Field(default=None, description="native query failed; state is the last stored")
    reclaimed_at: float | None = Field(default=None, description="when the owner last replaced the token (Reclaim)")
    id_base: int | None = Field(
        default=None,
        description="user namespace: the host uid/gid of the sandbox's root; uid n inside is id_base + n on the host",
    )


class CreateResponse(_Model):
    sandbox: SandboxInfo
    token: str


class ReclaimRequest(_Model):
    """Owner-level: replace the secret token of one sandbox of this sandboxd, named by ID and generation.

    For a caller that lost the token (its state was lost) but holds the ownership: it proves it by naming this
    sandboxd's ``owner`` on the same-UID socket (SBX-4's peer check), the way the daemon's own state dir is
    guarded. ``token`` is the NEW secret, chosen by the caller so that a retry after a lost reply converges:
    a sandbox that already holds exactly this token answers success again (``replayed``).
    """

    owner: str = Field(min_length=1, max_length=200, description="this sandboxd's owner UUID (Health.owner)")
    sandbox_id: str = Field(min_length=1, max_length=63)
    generation: int = Field(ge=1, description="the sandbox's current generation")
    token: str = Field(
        min_length=32, max_length=128, pattern=TOKEN_PATTERN, description="the new secret (32-128 of [A-Za-z0-9_-])"
    )

    @field_validator("sandbox_id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not SANDBOX_ID_RE.match(value):
            raise ValueError("must match ^[a-z0-9][a-z0-9-]{0,62}$")
        return value


class ReclaimResponse(_Model):
    sandbox: SandboxInfo
    token: str
    replayed: bool = Field(description="the sandbox already held this token: a retried Reclaim, nothing changed")


class ListResponse(_Model):
    sandboxes: list[SandboxInfo]


class DeleteResponse(_Model):
    sandbox_id: str
    generation: int
    state: State


class WaitRequest(_Model):
    ref: SandboxRef
    timeout_seconds: float = Field(default=3600.0, gt=0)


class WaitResponse(_Model):
    done: bool
    sandbox: SandboxInfo


class Stats(_Model):
    sandbox_id: str
    cpu_usage_ns: int
    memory_bytes: int
    memory_peak_bytes: int
    memory_cache_bytes: int = Field(default=0, description="page cache, part of memory_bytes")
    pids: int
    oom_kills: int
    disk_bytes: int = Field(description="bytes in the sandbox's writable layer (reported; not enforced on ext4)")
    observed_at: float


class DeviceInfo(_Model):
    path: str
    dev: str  # "major:minor" of the whole device backing it


class ResourceInfo(_Model):
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


class WarmPoolInfo(_Model):
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


class Health(_Model):
    ok: bool
    owner: str
    pid: int
    started_at: float
    storage_failed: bool
    spawner_alive: bool
    cgroups: dict[str, Any]
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
    warm_pool: WarmPoolInfo | None = Field(default=None, description="pre-warmed sandboxes (issue 16)")


class CheckpointRequest(_Model):
    ref: SandboxRef
    kind: Literal["filesystem"] = "filesystem"
    storage: str = Field(default="local", description="name of a configured artifact root")
    leave_running: bool = Field(default=True, description="thaw after capture (else stop the workload)")


class CheckpointInfo(_Model):
    checkpoint_id: str
    kind: Literal["filesystem"]
    location: str
    digest: str = Field(description="sha256 of manifest.json; Restore requires it")
    layer_sha256: str
    size_bytes: int
    created_at: float
    source_sandbox_id: str


class CheckpointRef(_Model):
    location: str
    digest: str = Field(description="the checkpoint's digest: only an artifact you can name exactly is deleted")


class ListCheckpointsRequest(_Model):
    storage: str = Field(default="local", description="name of a configured artifact root")


class StoredCheckpoint(_Model):
    checkpoint_id: str
    location: str
    digest: str = Field(description="sha256 of manifest.json")
    size_bytes: int
    created_at: float
    source_sandbox_id: str


class ListCheckpointsResponse(_Model):
    storage: str
    checkpoints: list[StoredCheckpoint] = Field(description="whole artifacts this daemon captured there")


class RestoreRequest(_Model):
    request_id: str = Field(min_length=1, max_length=200)
    location: str
    digest: str
    sandbox_id: str | None = None
    generation: int = Field(default=1, ge=1)
    token: CallerToken = None
    argv: list[str] | None = None
    init_argv: list[str] | None = None
    execd: ExecdOptions | None = Field(default=None, description="default: the checkpointed sandbox's")
    env: dict[str, str] | None = None
    resources: ResourcesSpec | None = None
    metadata: dict[str, str] | None = None
    ttl_seconds: float | None = Field(default=None, gt=0)
    network_policy: NetworkPolicy | None = Field(
        default=None, description="default: the checkpointed sandbox's network and policy"
    )
    log_group: LogGroup = Field(default=None, description="as CreateRequest.log_group (not taken from the checkpoint)")
    volumes: VolumeBinds = Field(default_factory=dict, description="as CreateRequest.volumes (not checkpointed)")


# == runtime control (the subscription's observations; camelCase on the wire) ==========================
class _Observation(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra="ignore")


class ActivityObservation(_Observation):
    version: int
    active: int
    background_running: int
    admission_open: bool


class ProbeObservation(_Observation):
    ok: bool
    consecutive_failures: int
    reason: str | None = None


class CheckpointRequestObservation(_Observation):
    operation_id: str
    reason: str | None = None
    requested_at: float = 0.0


class RuntimeObservation(_Observation):
    """What execd last reported for one sandbox (CTL-1); absent = no live execd connection (CTL-3)."""

    ready: bool
    probe: ProbeObservation | None = None
    activity: ActivityObservation
    checkpoint_requests: list[CheckpointRequestObservation] = Field(default_factory=list)
    workload_exit_code: int | None = None
    #: Why sandboxd refused this sandbox's execd (CTL-8: another protocol version); None when it is served.
    refused: str | None = None
