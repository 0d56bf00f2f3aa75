"""Configuration of ``adx sandboxd`` (TOML, validated; unknown keys are errors)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from adx.config._base import LoggingConfig, StrictModel
from adx.config._fields import BaseImageName, cpu_overcommit_ratio, seconds
from adx.model import NetworkPolicy
from adx.sandboxd._devices import DEVICE_ID

__all__ = ["CapacityConfig", "DefaultsConfig", "IdRange", "SandboxdConfig"]

MAX_UNIX_SOCKET_PATH = 107  # sun_path is 108 bytes including the NUL


class CapacityConfig(StrictModel):
    """What this node may reserve for sandboxes; 0 means "measure the host at start"."""

    cpu_millis: int = Field(default=0, ge=0, description="CPU for sandboxes, in millicores; 0: the host's")
    memory_bytes: int = Field(default=0, ge=0, description="memory for sandboxes; 0: the host's")
    disk_bytes: int = Field(
        default=0, ge=0, description="disk for sandboxes; 0: the free space of the state directory's filesystem"
    )
    max_sandboxes: int = Field(default=1000, ge=1, le=100_000, description="sandboxes this sandboxd runs at most")
    cpu_overcommit: float = cpu_overcommit_ratio(
        1.0,
        "CPU reservations may reach cpu_millis times this (memory and disk never exceed theirs). The "
        "node's own cpu_overcommit must not be larger, or sandboxd refuses what placement admitted (adx up sets "
        "both). The Resource call still reports cpu_millis itself",
    )


class DefaultsConfig(StrictModel):
    """Resources of a sandbox whose request leaves them out."""

    cpu_millis: int = Field(default=1000, ge=10, description="CPU of a sandbox that asks for none, in millicores")
    memory_bytes: int = Field(default=512 << 20, ge=8 << 20, description="memory of a sandbox that asks for none")
    pids_max: int = Field(default=1024, ge=8, description="processes and threads a sandbox may have (pids.max)")
    disk_bytes: int = Field(
        default=1 << 30, ge=0, description="disk of a sandbox that asks for none (enforced with disk_quota)"
    )
    tmp_bytes: int | None = Field(
        default=None,
        ge=1 << 20,
        description="obsolete, enforces nothing (accepted so older configs still load; a warning at start): /tmp "
        "is no longer a tmpfs but part of the sandbox's writable layer, which checkpoints keep",
    )
    network: Literal["none", "host", "veth"] = Field(
        default="none",
        description="none: only lo; veth: a veth pair with egress through the node under the network policy; "
        "host: the host's network namespace",
    )
    network_policy: NetworkPolicy | None = Field(
        default=None,
        description="the node default for Environments that give no network: {mode='egress', allow=[...], "
        "deny=[...]}; unset: veth sandboxes reach every destination but other sandboxes and the node",
    )


class IdRange(StrictModel):
    """Host IDs sandboxd gives to sandboxes (like a line of /etc/subuid, for uids and gids alike): 65536 each."""

    start: int = Field(default=1 << 28, ge=65536, description="first host uid/gid of the range (above host accounts)")
    count: int = Field(default=1 << 28, ge=65536, description="how many IDs: a multiple of 65536, one slice each")

    @model_validator(mode="after")
    def _fits(self) -> IdRange:
        if self.count % 65536:
            raise ValueError(f"count {self.count} must be a multiple of 65536 (one slice per sandbox)")
        if self.start + self.count > 0xFFFFFFFF:
            raise ValueError(f"start + count = {self.start + self.count} exceeds the largest uid (4294967294)")
        return self


class SandboxdConfig(StrictModel):
    state_dir: Path = Field(default=Path("/var/lib/adx/sandboxd"), description="private registry dir (0700)")
    socket_path: Path | None = Field(default=None, description="API socket; default <state_dir>/api/sandboxd.sock")
    cgroup_parent: str = Field(
        default="adx-sandboxd",
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
        description="cgroup directory (relative to each hierarchy root) holding one cgroup per sandbox",
    )
    images_dir: Path | None = Field(default=None, description="default <state_dir>/images")
    checkpoint_dirs: dict[str, Path] = Field(
        default_factory=dict,
        description="named artifact roots, e.g. {shared = '/mnt/ckpt'}; 'local' defaults to <state_dir>/checkpoints",
    )
    veth_pool: str = Field(
        default="10.213.0.0/16",
        description="IPv4 pool for network='veth' sandboxes: one /30 each (host end .1, sandbox .2)",
    )
    ro_binds: dict[str, Path] = Field(
        default_factory=dict,
        description="read-only host dirs in every sandbox, {'/opt/adx' = '/var/lib/adx/execd-runtime'}: e.g. execd",
    )
    execd_runtime_dir: Path | None = Field(
        default=None,
        description="execd's modules, mounted read-only at /opt/adx in sandboxes created with `execd`; "
        "default <state_dir>/execd-runtime, (re)installed by sandboxd at every start",
    )
    execd_in_process: bool = Field(
        default=True,
        description="execd sandboxes whose python is the host's (default image, own execd runtime): PID 1 runs "
        "execd in process, forked from a template that imported it, instead of exec'ing a fresh interpreter",
    )
    base_image: BaseImageName = Field(
        default="host",
        description="what 'base' (the default image) is: 'host', the host-derived skeleton with the host's /usr "
        "bound read-only; 'debian', the store's Debian image (mmdebstrap; built in the background on first start, "
        "~2.5-4 min, creates of 'base' wait with a 503 meanwhile; docs/images.md)",
    )
    runtime_control_socket_path: Path | None = Field(
        default=None,
        description="node-level runtime-control subscription socket (CTL-2); default next to the API socket",
    )
    disk_quota: Literal["off", "btrfs", "auto"] = Field(
        default="off",
        description="'btrfs': each sandbox's writable layer is a subvolume of a loop-mounted btrfs image sandboxd "
        "owns (beside state_dir), limited to its disk request by a qgroup; writes past it fail with EDQUOT; "
        "'auto': btrfs where this host can mount it (btrfs-progs, the btrfs module, loop devices), else off "
        "with a warning and health's disk_quota_note saying why (adx up's default)",
    )
    storage_image_bytes: int = Field(
        default=256 << 30,
        ge=1 << 30,
        description="size of that (sparse) btrfs image: only written bytes take host disk",
    )
    user_namespace: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="sandbox root is an unprivileged host ID slice of id_range (a user namespace each); 'auto': "
        "on where the host supports it, 'on': refuse to start where it does not, 'off': sandbox root is host root",
    )
    warm_pool: int = Field(
        default=2,
        ge=0,
        le=64,
        description="pre-warmed sandboxes kept per shape (image, resources, network): a matching create claims "
        "one instead of starting a sandbox; 0: off (docs/sandboxd.md, 'Warm pool')",
    )
    warm_pool_shapes: int = Field(
        default=4,
        ge=1,
        le=16,
        description="most shapes kept warm: those created most in the last two minutes, then the defaults' shape "
        "(memory left after reservations bounds them too)",
    )
    id_range: IdRange = IdRange()
    capacity: CapacityConfig = CapacityConfig()
    defaults: DefaultsConfig = DefaultsConfig()
    max_record_bytes: int = Field(default=1 << 20, ge=4096, description="larger registry files are refused")
    create_timeout_seconds: float = seconds(
        30.0, "longest a create (or restore) may take until its sandbox runs", le=600
    )
    cpu_boost_seconds: float = seconds(
        2.0,
        "start-up boost of an execd sandbox: it runs without its CPU quota until execd reports Ready, at most this "
        "long (its quota then applies whatever it does); 0: the quota from the start (docs/resources.md)",
        le=30,
        ge=0,
    )
    delete_timeout_seconds: float = seconds(
        10.0,
        "how long a delete waits for a sandbox's processes to be gone before it reports failure "
        "(maintenance retries it)",
        le=600,
    )
    checkpoint_timeout_seconds: float = seconds(
        300.0, "longest a checkpoint, restore or layer commit may take", le=3600
    )
    request_timeout_seconds: float = seconds(
        30.0, "bound of every other call, added to the timeouts above for theirs", le=600
    )
    max_wait_seconds: float = seconds(3600.0, "longest a Wait call may wait for a sandbox's state", le=86400)
    maintenance_interval_seconds: float = seconds(
        1.0, "how often pending deletes and reclaims are retried and expired sandboxes removed", le=3600
    )
    resource_refresh_seconds: float = seconds(
        5.0,
        "how often the Resource report (capacity, devices) is refreshed; health calls it stale after 3 periods",
        le=3600,
    )
    logs_max_bytes: int = Field(
        default=8 << 20,
        ge=64 << 10,
        description="workload output kept per log group (an Environment: all its executions); oldest segments go",
    )
    logs_segment_bytes: int = Field(
        default=1 << 20, ge=4 << 10, description="a log segment ends (rotation) past this size; <= logs_max_bytes"
    )
    devices: list[str] = Field(
        default_factory=list, description="whole-device IDs this host offers (RES-2), e.g. 'gpu0'; never probed"
    )
    devices_file: Path | None = Field(
        default=None, description="a JSON list of further device IDs, re-read on every resource refresh (RES-8)"
    )
    logging: LoggingConfig = LoggingConfig()

    @field_validator("devices")
    @classmethod
    def _device_ids(cls, value: list[str]) -> list[str]:
        for i, item in enumerate(value):
            if not DEVICE_ID.match(item):
                raise ValueError(f"devices[{i}]: {item!r} must match {DEVICE_ID.pattern}")
        return value

    @field_validator("checkpoint_dirs")
    @classmethod
    def _names(cls, value: dict[str, Path]) -> dict[str, Path]:
        for name, path in value.items():
            if not name.isidentifier():
                raise ValueError(f"checkpoint dir name {name!r} must be an identifier")
            if not path.is_absolute():
                raise ValueError(f"checkpoint dir {name!r} must be an absolute path")
        return value

    @field_validator("veth_pool")
    @classmethod
    def _pool(cls, value: str) -> str:
        net = ipaddress.ip_network(value)  # ValueError names the problem
        if net.version != 4 or net.prefixlen > 29 or not net.is_private:
            raise ValueError("must be a private IPv4 network of /29 or larger")
        return str(net)

    @field_validator("ro_binds")
    @classmethod
    def _binds(cls, value: dict[str, Path]) -> dict[str, Path]:
        for inside, host in value.items():
            parts = Path(inside).parts
            if (
                not inside.startswith("/")
                or len(parts) < 2
                or parts[1] in ("proc", "dev", "tmp", "usr")
                or ".." in parts
            ):
                raise ValueError(f"{inside!r} must be an absolute path outside /proc, /dev, /tmp and /usr")
            if not host.is_absolute():
                raise ValueError(f"host dir for {inside!r} must be an absolute path")
        return value

    @model_validator(mode="after")
    def _socket_len(self) -> SandboxdConfig:
        if len(str(self.api_socket.absolute())) > MAX_UNIX_SOCKET_PATH:
            raise ValueError(f"socket_path {self.api_socket} is longer than {MAX_UNIX_SOCKET_PATH} bytes")
        if self.runtime_control_socket_path is not None and not self.runtime_control_socket_path.is_absolute():
            raise ValueError("runtime_control_socket_path must be an absolute path")
        if self.execd_runtime_dir is not None and not self.execd_runtime_dir.is_absolute():
            raise ValueError("execd_runtime_dir must be an absolute path")
        return self

    @property
    def api_socket(self) -> Path:
        return self.socket_path or self.state_dir / "api" / "sandboxd.sock"

    @property
    def runtime_control_socket(self) -> Path:
        return self.runtime_control_socket_path or self.api_socket.parent / "runtime-control.sock"

    @property
    def execd_runtime(self) -> Path:
        return self.execd_runtime_dir or self.state_dir / "execd-runtime"

    @property
    def images_root(self) -> Path:
        return self.images_dir or self.state_dir / "images"

    def artifact_roots(self) -> dict[str, Path]:
        roots = {"local": self.state_dir / "checkpoints"}
        roots.update(self.checkpoint_dirs)
        return roots
