"""What sandboxd tells the spawner, a zygote, the supervisor and a prepared init about one sandbox to start.

It crosses three process boundaries as JSON (sandboxd -> spawner -> zygote/supervisor -> prepared init), each
side the same version of this module. Plain dataclasses and ``json`` only: the spawner's template (the memory of
every in-process execd PID 1) imports this, and neither pydantic nor pathlib belongs there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

__all__ = ["Limits", "NativeFile", "SpawnReport", "SpawnSpec", "UserNamespace", "Veth", "read_to_eof"]


class NativeFile(TypedDict):
    """The native identity the supervisor writes (``native.json``) and reports; sandboxd validates it as
    ``NativeIdentity``."""

    boot_id: str
    cgroup_dev: int
    cgroup_ino: int
    cgroup_dir: str
    created_at: float


class SpawnReport(TypedDict):
    """A supervisor's one JSON report of a start, relayed by the spawner (which adds ``req``, the request it
    answers) to sandboxd's ``SpawnClient``."""

    ok: bool
    error: NotRequired[str]  # ok false: why
    native: NotRequired[NativeFile]  # a started sandbox
    started_at: NotRequired[float]
    warm: NotRequired[bool]  # a warm pool member is ready (parked until claimed)
    pids: NotRequired[list[int]]  # a ready member's: its supervisor and its init (sandboxd watches both)
    #: a started sandbox's: the supervisor's own steps in milliseconds (sandboxd's "create timings" debug log)
    phases: NotRequired[dict[str, float]]
    req: NotRequired[int]


def read_to_eof(fd: int) -> bytes:
    """All a pipe carries until its writer closes it (a spec, a claim, an init's error report); closes ``fd``.
    Empty means the writer went away without a word (each reader decides what that ends)."""
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


@dataclass(frozen=True)
class Veth:
    """A veth sandbox's addresses: the host end's name and address, the sandbox end's (``eth0``)."""

    host_if: str
    host_ip: str
    sandbox_ip: str
    prefix: int = 30


@dataclass(frozen=True)
class UserNamespace:
    """The sandbox's slice of host IDs: its root is host ID ``base``."""

    base: int
    size: int


@dataclass(frozen=True)
class Limits:
    """The cgroup limits the supervisor sets (``disk_bytes`` is the writable layer's, set by sandboxd)."""

    cpu_millis: int
    memory_bytes: int
    pids_max: int
    disk_bytes: int = 0


@dataclass(frozen=True)
class SpawnSpec:
    sandbox_id: str
    sandbox_dir: str
    #: overlayfs lower layers, topmost first, colon-joined (a store image), or the host-derived skeleton.
    image_root: str
    #: host dirs the skeleton binds read-only at the same path (none for a store image).
    image_binds: list[str]
    init_argv: list[str]
    env: dict[str, str]
    cwd: str
    hostname: str
    network: str  # 'host', 'none' or 'veth'
    cgroup_parent: str
    resources: Limits
    log_dir: str
    log_segment_bytes: int
    log_max_bytes: int
    run_dir: str | None = None
    ro_binds: dict[str, str] = field(default_factory=dict)
    volume_binds: dict[str, str] = field(default_factory=dict)  # read-write: inside -> host dir (idmapped)
    upper_dir: str | None = None  # default: the sandbox dir's ``upper``
    work_dir: str | None = None  # default: the sandbox dir's ``ovlwork``
    veth: Veth | None = None
    execd_sockets: str | None = None  # execd sandboxes: host dir of its listening sockets
    control_dir: str | None = None  # execd sandboxes: host dir of its runtime control socket
    userns: UserNamespace | None = None
    allow_setuid: bool = False  # store images: sudo works (see _in_namespace)
    execd_inproc: bool = False  # PID 1 runs execd in process (the spawner's template)
    output_pipes: bool = False  # set by the supervisor: the init's stdout/stderr open the pump's FIFOs
    #: A warm pool member (``_warm_pool``): made ready, then parked until a create claims it with its own spec.
    warm: bool = False
    #: An execd sandbox's start-up boost (``_cgroups.CpuPhase``): no CPU quota until execd reports Ready, at most
    #: this long from the start (the supervisor's bound); 0: the quota from the start.
    cpu_boost_seconds: float = 0.0

    @property
    def runs_execd(self) -> bool:
        """PID 1 is execd: ``init_argv`` is ``PYTHON -m adx.execd ...`` (``_launch.init_argv``)."""
        return self.init_argv[1:3] == ["-m", "adx.execd"]

    @property
    def execd_in_process(self) -> bool:
        """PID 1 runs execd in process, from the spawner's template that imported it (``_become_execd``)."""
        return self.execd_inproc and self.runs_execd

    @property
    def prestarts_execd(self) -> bool:
        """A warm member whose PID 1 would exec execd's interpreter (a store image's python3): it execs it before
        the claim, into ``adx.execd._prestart``, which imports execd and waits for the claim's argv and environment
        (issue 16). Not with ``execd_inproc``: that PID 1 has execd imported already (the spawner's template)."""
        return self.warm and not self.execd_inproc and self.runs_execd

    def to_json(self) -> bytes:
        return json.dumps(self.to_wire()).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> SpawnSpec:
        return cls.from_wire(json.loads(data))

    def to_wire(self) -> dict[str, object]:
        """The JSON object form (inside the spawner's request line). Shallow on purpose: ``asdict`` deep-copies
        every list and dict, several times slower on the create path, and JSON only reads them."""
        wire = dict(vars(self))
        for name in ("resources", "veth", "userns"):
            value = wire[name]
            wire[name] = dict(vars(value)) if value is not None else None
        return wire

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> SpawnSpec:
        veth, userns = raw.get("veth"), raw.get("userns")
        return cls(
            **{
                **raw,
                "resources": Limits(**raw["resources"]),
                "veth": Veth(**veth) if veth is not None else None,
                "userns": UserNamespace(**userns) if userns is not None else None,
            }
        )
