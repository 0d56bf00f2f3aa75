"""The per-sandbox calls of sandboxd's API: Create, SetNetwork, Get/List/Wait, Output, Reclaim and Delete."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from adx.model import ImageName, NetworkPolicy
from adx.sandboxd._sandbox_models import (
    TOKEN_PATTERN,
    CallerToken,
    ExecdOptions,
    ExitStatus,
    LogGroup,
    NativeIdentity,
    Resources,
    ResourcesSpec,
    SandboxId,
    SandboxRef,
    VolumeBinds,
    WireModel,
)
from adx.sandboxd._states import State

__all__ = [
    "CreateRequest",
    "CreateResponse",
    "DeleteResponse",
    "ListResponse",
    "OutputResponse",
    "ReclaimRequest",
    "ReclaimResponse",
    "SandboxInfo",
    "SetNetworkRequest",
    "WaitRequest",
    "WaitResponse",
]

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


class CreateRequest(WireModel):
    request_id: str = Field(min_length=1, max_length=200, description="idempotency key")
    sandbox_id: SandboxId | None = Field(default=None, description="optional caller-chosen ID (never reused)")
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
    image: ImageName | None = Field(
        default=None,
        description="image of the image store (its env, workdir and user apply); unset or 'base': the node's default",
    )
    image_layers: list[str] | None = Field(
        default=None,
        max_length=128,
        description="explicit store layers, bottom first, instead of a named image (image builds, restores)",
    )

    @field_validator("image_layers")
    @classmethod
    def _layers(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not all(_DIGEST_RE.match(d) for d in value):
            raise ValueError("must be sha256 hex digests of store layers")
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


class SetNetworkRequest(WireModel):
    """Replace a running veth sandbox's egress policy in place (one nft transaction)."""

    sandbox_id: str
    generation: int
    token: str
    owner: str | None = None
    policy: NetworkPolicy

    @property
    def ref(self) -> SandboxRef:
        return SandboxRef(sandbox_id=self.sandbox_id, generation=self.generation, token=self.token, owner=self.owner)


class OutputResponse(WireModel):
    """The tail of what the sandbox's PID 1 wrote to stdout/stderr (sandboxes without execd)."""

    output: str
    truncated: bool


class SandboxInfo(WireModel):
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


class CreateResponse(WireModel):
    sandbox: SandboxInfo
    token: str


class ReclaimRequest(WireModel):
    """Owner-level: replace the secret token of one sandbox of this sandboxd, named by ID and generation.

    For a caller that lost the token (its state was lost) but holds the ownership: it proves it by naming this
    sandboxd's ``owner`` on the same-UID socket (SBX-4's peer check), the way the daemon's own state dir is
    guarded. ``token`` is the NEW secret, chosen by the caller so that a retry after a lost reply converges:
    a sandbox that already holds exactly this token answers success again (``replayed``).
    """

    owner: str = Field(min_length=1, max_length=200, description="this sandboxd's owner UUID (Health.owner)")
    sandbox_id: SandboxId = Field(min_length=1, max_length=63)
    generation: int = Field(ge=1, description="the sandbox's current generation")
    token: str = Field(
        min_length=32, max_length=128, pattern=TOKEN_PATTERN, description="the new secret (32-128 of [A-Za-z0-9_-])"
    )


class ReclaimResponse(WireModel):
    sandbox: SandboxInfo
    token: str
    replayed: bool = Field(description="the sandbox already held this token: a retried Reclaim, nothing changed")


class ListResponse(WireModel):
    sandboxes: list[SandboxInfo]


class DeleteResponse(WireModel):
    sandbox_id: str
    generation: int
    state: State


class WaitRequest(WireModel):
    ref: SandboxRef
    timeout_seconds: float = Field(default=3600.0, gt=0)


class WaitResponse(WireModel):
    done: bool
    sandbox: SandboxInfo
