"""Sandbox cgroups on cgroup v1, cgroup v2 or the hybrid of both (detected once at start).

- cgroup2 (when mounted) carries identity, ``cgroup.kill`` and ``cgroup.freeze``, and is where the workload
  is cloned into (``CLONE_INTO_CGROUP``).
- Limits and stats (memory, cpu, pids) come from whichever version owns each controller: on a hybrid host the
  v1 hierarchies own them (a controller bound to v1 cannot be enabled in v2); on a v2-only host, v2 does.

Paths are kept as ``str`` (``os.path``), not ``pathlib``: the spawner's template imports this module, and every
page the template holds counts in each in-process execd PID 1 (pathlib pulls urllib.parse and ipaddress,
~0.65 MiB). The ``Path`` views (``v2_root``, ``v1_mounts``, ``roots``, ``dirs``, ``identity_dir``) import
it on first use, for sandboxd and tests.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["CgroupLayout", "CgroupStats", "CpuPhase", "SandboxCgroup", "cpu_bandwidth", "detect_layout"]

_CONTROLLERS = ("memory", "cpu", "pids")


def _path(path: str) -> Path:
    from pathlib import Path  # not at import: see the module's docstring

    return Path(path)


class CgroupsDescription(TypedDict):
    """Where each controller was found (Health's ``cgroups``): ``v1``, ``v2`` or None (missing)."""

    v2_root: str | None
    controllers: dict[str, str | None]


@dataclass(frozen=True)
class CgroupLayout:
    v2_dir: str | None  # the cgroup2 mount point
    v2_controllers: frozenset[str]
    v1_dirs: dict[str, str] = field(default_factory=dict)  # controller -> mount point

    @property
    def v2_root(self) -> Path | None:
        return _path(self.v2_dir) if self.v2_dir is not None else None

    @property
    def v1_mounts(self) -> dict[str, Path]:
        return {controller: _path(mount) for controller, mount in self.v1_dirs.items()}

    @property
    def roots(self) -> list[Path]:
        """Every hierarchy's mount point, each once (co-mounted v1 controllers share one), cgroup2's first."""
        roots = [self.v2_root] if self.v2_root else []
        return roots + list(dict.fromkeys(self.v1_mounts.values()))

    def source(self, controller: str) -> str | None:
        """'v1', 'v2' or None: which hierarchy provides ``controller``."""
        if controller in self.v1_dirs:
            return "v1"
        if self.v2_dir is not None and controller in self.v2_controllers:
            return "v2"
        return None

    def missing(self) -> list[str]:
        return [c for c in _CONTROLLERS if self.source(c) is None]

    def describe(self) -> CgroupsDescription:
        return {
            "v2_root": self.v2_dir,
            "controllers": {c: self.source(c) for c in (*_CONTROLLERS, "cpuacct", "freezer")},
        }


def detect_layout(mountinfo: str | None = None) -> CgroupLayout:
    text = mountinfo if mountinfo is not None else _read_text("/proc/self/mountinfo")
    v2_root: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        mount_point, fstype, super_opts = _normpath(fields[4]), rfields[0], rfields[2].split(",")
        if fstype == "cgroup2" and v2_root is None:
            v2_root = mount_point
        elif fstype == "cgroup":
            for opt in super_opts:
                if opt in ("memory", "cpu", "cpuacct", "pids", "freezer"):
                    v1.setdefault(opt, mount_point)
    controllers: frozenset[str] = frozenset()
    if v2_root is not None:
        with contextlib.suppress(OSError):
            controllers = frozenset(_read_text(f"{v2_root}/cgroup.controllers").split())
    return CgroupLayout(v2_dir=v2_root, v2_controllers=controllers, v1_dirs=v1)


@dataclass(frozen=True)
class CgroupStats:
    cpu_usage_ns: int
    memory_bytes: int
    memory_peak_bytes: int
    pids: int
    oom_kills: int
    memory_cache_bytes: int = 0  # page cache charged to the sandbox (part of memory_bytes)


def _normpath(path: str) -> str:
    """What ``str(Path(path))`` gives: empty and ``.`` parts dropped (``..`` kept)."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if path.startswith("/"):
        return "/" + "/".join(parts)
    return "/".join(parts) or "."


def _read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


#: The CFS period of a sandbox's CPU limit: the kernel's default. A shorter one would cut the longest wait of a
#: throttled task, but also how long a sandbox may run at once (a 0.5-CPU sandbox gets 50 ms of every 100 ms).
CPU_PERIOD_US = 100_000


def cpu_bandwidth(cpu_millis: int) -> tuple[int, int, int]:
    """(period, quota, burst) in microseconds for a sandbox of ``cpu_millis``.

    The quota is the request exactly: over any long run the sandbox gets ``cpu_millis`` / 1000 CPUs. The burst
    lets a sandbox that was idle spend up to one more quota in a period (the kernel saves the periods' unused
    quota up to this amount, and allows at most the quota itself), so short work right after other short work
    does not wait for the next period: Debian's ``node -v`` costs ~25 ms of the sandbox's CPU with execd's
    share, two of them within 100 ms spend a 0.5-CPU quota, and the second was throttled for 36-43 ms of its
    62 ms (issue 16). Over T seconds the sandbox gets at most ``quota * T / period + burst``.
    """
    quota = max(1000, cpu_millis * CPU_PERIOD_US // 1000)
    return CPU_PERIOD_US, quota, quota


class CpuPhase(enum.Enum):
    """Where a sandbox is in its CPU life (issue 16), the one place that decides its CPU controller's files.

    execd's start-up (an interpreter's imports, asyncio: ~90 ms of CPU on the Debian image's own python3) is the
    platform's cost, not the workload's; under an Environment's quota (10 millicores: 1 ms every 100 ms) it took
    6 s. So an execd sandbox starts ``STARTING`` and becomes ``LIMITED`` when execd reports Ready (sandboxd's
    control hub sees it) or at ``cpu_boost_seconds`` (its supervisor), whichever comes first: nothing runs
    without its quota for longer than that bound. A warm member waits ``PARKED`` (its pre-started execd imports
    at idle priority: a refill never competes with a claimed sandbox); its claim makes it ``STARTING``, as a cold
    start. A sandbox without execd has no Ready to wait for: ``LIMITED`` from the start. Memory and pids limits
    never change."""

    STARTING = "starting"  # no quota, the normal weight
    PARKED = "parked"  # no quota, the idle weight
    LIMITED = "limited"  # the quota and its burst (``cpu_bandwidth``), the normal weight


#: cgroup v2 ``cpu.weight`` (1-10000) and v1 ``cpu.shares`` (2-262144): the kernel's default for a sandbox, the
#: smallest for a parked member (contending with one sandbox, it gets ~1 % of a CPU; alone, all it wants).
_WEIGHT = {"v2": (100, 1), "v1": (1024, 2)}


def _write_burst(path: str, burst_us: int) -> None:
    """The burst is a latency nicety on top of an exact quota: a kernel without it (before 5.14, or built
    without ``CONFIG_CFS_BANDWIDTH`` bursts) leaves the file out, and the sandbox runs with the plain quota."""
    if os.path.exists(path):
        _write(path, str(burst_us))


def _read_int(path: str, default: int = 0) -> int:
    try:
        text = _read_text(path).strip()
    except FileNotFoundError:
        return default
    return int(text) if text and text != "max" else default


def _keyed(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in _read_text(path).splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[key] = int(value)
    except FileNotFoundError:
        pass
    return out


class SandboxCgroup:
    """The cgroup(s) of one sandbox: ``<hierarchy>/<parent>/<sandbox_id>`` in every hierarchy used."""

    def __init__(self, layout: CgroupLayout, parent: str, sandbox_id: str) -> None:
        self.layout = layout
        self.parent = parent.strip("/")
        self.sandbox_id = sandbox_id
        self._parts = [part for part in self.parent.split("/") if part not in ("", ".")]
        leaf = "/".join([*self._parts, sandbox_id])
        self.v2_dir: str | None = _normpath(f"{layout.v2_dir}/{leaf}") if layout.v2_dir else None
        self.v1_dirs: dict[str, str] = {}
        wanted = [c for c in _CONTROLLERS if layout.source(c) == "v1"]
        if "cpu" in wanted and "cpuacct" in layout.v1_dirs:
            wanted.append("cpuacct")
        if layout.v2_dir is None and "freezer" in layout.v1_dirs:
            wanted.append("freezer")  # v1-only hosts: freeze and kill through the freezer
        for controller in wanted:
            self.v1_dirs[controller] = _normpath(f"{layout.v1_dirs[controller]}/{leaf}")

    # -- paths --------------------------------------------------------------------------------------
    def _dirs(self) -> list[str]:
        seen: list[str] = []
        for path in ([self.v2_dir] if self.v2_dir else []) + list(self.v1_dirs.values()):
            if path not in seen:
                seen.append(path)
        return seen

    def dirs(self) -> list[Path]:
        """Distinct cgroup directories of this sandbox (co-mounted controllers share one)."""
        return [_path(path) for path in self._dirs()]

    def identity_path(self) -> str:
        """:meth:`identity_dir` as a ``str``."""
        if self.v2_dir is not None:
            return self.v2_dir
        return self.v1_dirs.get("memory") or self._dirs()[0]

    def identity_dir(self) -> Path:
        return _path(self.identity_path())

    def identity(self) -> tuple[int, int] | None:
        """(st_dev, st_ino) of the identity directory, or None when it does not exist."""
        try:
            st = os.stat(self.identity_path())
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def v1_procs_files(self) -> list[str]:
        return [f"{p}/cgroup.procs" for p in dict.fromkeys(self.v1_dirs.values())]

    # -- lifecycle ----------------------------------------------------------------------------------
    def create(
        self,
        cpu_millis: int,
        memory_bytes: int,
        pids_max: int,
        *,
        defer_v1: bool = False,
        parent: bool = True,
        cpu: CpuPhase = CpuPhase.LIMITED,
    ) -> None:
        """Create the directories and set the limits. Fails if the leaf already exists (IDs are unique).

        ``defer_v1``: create only the cgroup2 directory now; ``create_v1`` does the v1 hierarchies later (the
        supervisor overlaps that with the child's mount setup on hybrid hosts). ``parent=False``: the caller
        did :meth:`ensure_parent` already. ``cpu``: the phase it starts in (:class:`CpuPhase`).
        """
        if self.v2_dir is not None:
            if parent:
                self._ensure_v2_parent()
            os.mkdir(self.v2_dir)
            self._set_limits(cpu_millis, memory_bytes, pids_max, cpu, v1=False)
        if not defer_v1:
            self.create_v1(cpu_millis, memory_bytes, pids_max, cpu)

    def create_v1(self, cpu_millis: int, memory_bytes: int, pids_max: int, cpu: CpuPhase = CpuPhase.LIMITED) -> None:
        for path in dict.fromkeys(self.v1_dirs.values()):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.mkdir(path)
        self._set_limits(cpu_millis, memory_bytes, pids_max, cpu, v1=True)

    def set_cpu(self, phase: CpuPhase, cpu_millis: int) -> None:
        """Move the sandbox to ``phase`` (idempotent: the supervisor's bound and sandboxd's Ready may both end one
        start-up)."""
        source = self.layout.source("cpu")
        if source == "v1":
            self._set_cpu(phase, cpu_millis, self.v1_dirs["cpu"], "v1")
        elif source == "v2" and self.v2_dir is not None:
            self._set_cpu(phase, cpu_millis, self.v2_dir, "v2")

    @staticmethod
    def _set_cpu(phase: CpuPhase, cpu_millis: int, path: str, version: str) -> None:
        period, quota, burst = cpu_bandwidth(cpu_millis)
        normal, idle = _WEIGHT[version]
        weight = idle if phase is CpuPhase.PARKED else normal
        # Order matters to the kernel: a burst above the quota is refused, so the quota goes first (a boosted
        # cgroup's burst is still 0: it is only ever set here, with its quota).
        if version == "v1":
            _write(f"{path}/cpu.shares", str(weight))
            _write(f"{path}/cpu.cfs_period_us", str(period))
            _write(f"{path}/cpu.cfs_quota_us", str(quota) if phase is CpuPhase.LIMITED else "-1")
            if phase is CpuPhase.LIMITED:
                _write_burst(f"{path}/cpu.cfs_burst_us", burst)
        else:
            _write(f"{path}/cpu.weight", str(weight))
            _write(f"{path}/cpu.max", f"{quota if phase is CpuPhase.LIMITED else 'max'} {period}")
            if phase is CpuPhase.LIMITED:
                _write_burst(f"{path}/cpu.max.burst", burst)

    def ensure_parent(self) -> None:
        """The cgroup2 parent (with the controllers enabled down to it); nothing of this sandbox's own."""
        if self.v2_dir is not None:
            self._ensure_v2_parent()

    def _ensure_v2_parent(self) -> None:
        assert self.v2_dir is not None and self.layout.v2_dir is not None
        wanted = [c for c in _CONTROLLERS if self.layout.source(c) == "v2"]
        node = self.layout.v2_dir
        for part in self._parts:
            if wanted:
                # Controllers must be enabled in every ancestor's subtree_control to reach the leaf.
                _write(f"{node}/cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
            node = _normpath(f"{node}/{part}")
            try:
                os.mkdir(node)
            except OSError:
                if not os.path.isdir(node):
                    raise
        if wanted:
            _write(f"{node}/cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))

    def _set_limits(self, cpu_millis: int, memory_bytes: int, pids_max: int, cpu: CpuPhase, *, v1: bool) -> None:
        """Set the limits of the v1 hierarchies (``v1=True``) or of the cgroup2 directory."""
        want = "v1" if v1 else "v2"
        if self.layout.source("memory") == want == "v1":
            mem = self.v1_dirs["memory"]
            _write(f"{mem}/memory.limit_in_bytes", str(memory_bytes))
            # Without swap accounting a sandbox could page past its limit; memsw exists only with swap on.
            if os.path.exists(f"{mem}/memory.memsw.limit_in_bytes"):
                with contextlib.suppress(OSError):
                    _write(f"{mem}/memory.memsw.limit_in_bytes", str(memory_bytes))
        elif self.layout.source("memory") == want == "v2" and self.v2_dir is not None:
            _write(f"{self.v2_dir}/memory.max", str(memory_bytes))
            if os.path.exists(f"{self.v2_dir}/memory.swap.max"):
                _write(f"{self.v2_dir}/memory.swap.max", "0")
        if self.layout.source("cpu") == want:
            self.set_cpu(cpu, cpu_millis)
        if self.layout.source("pids") == want == "v1":
            _write(f"{self.v1_dirs['pids']}/pids.max", str(pids_max))
        elif self.layout.source("pids") == want == "v2" and self.v2_dir is not None:
            _write(f"{self.v2_dir}/pids.max", str(pids_max))

    def exists(self) -> bool:
        return os.path.isdir(self.identity_path())

    def procs(self) -> set[int]:
        pids: set[int] = set()
        for path in self._dirs():
            try:
                pids.update(int(x) for x in _read_text(f"{path}/cgroup.procs").split())
            except FileNotFoundError:
                continue
        return pids

    def is_empty(self) -> bool:
        return not self.procs()

    def kill(self) -> None:
        """Kill every process in the sandbox (identity must have been checked by the caller)."""
        if self.v2_dir is not None and os.path.isdir(self.v2_dir):
            # Kills the whole tree, double-forked daemons included, in one write; no PIDs involved.
            _write(f"{self.v2_dir}/cgroup.kill", "1")
            # A frozen cgroup stays frozen after a kill; thaw so the cgroup is reusable/removable cleanly.
            with contextlib.suppress(OSError):
                _write(f"{self.v2_dir}/cgroup.freeze", "0")
            return
        freezer = self.v1_dirs.get("freezer")
        # v1-only fallback: freeze so nothing forks while we signal, kill what is listed, thaw, repeat.
        for _ in range(100):
            pids = self.procs()
            if not pids:
                return
            if freezer is not None:
                _write(f"{freezer}/freezer.state", "FROZEN")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if freezer is not None:
                _write(f"{freezer}/freezer.state", "THAWED")
            time.sleep(0.005)

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self.is_empty():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)

    def freeze(self, timeout: float = 5.0) -> None:
        if self.v2_dir is not None:
            _write(f"{self.v2_dir}/cgroup.freeze", "1")
            deadline = time.monotonic() + timeout
            while _keyed(f"{self.v2_dir}/cgroup.events").get("frozen") != 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cgroup {self.v2_dir} did not freeze within {timeout}s")
                time.sleep(0.002)
        elif "freezer" in self.v1_dirs:
            _write(f"{self.v1_dirs['freezer']}/freezer.state", "FROZEN")

    def thaw(self) -> None:
        if self.v2_dir is not None:
            _write(f"{self.v2_dir}/cgroup.freeze", "0")
        elif "freezer" in self.v1_dirs:
            _write(f"{self.v1_dirs['freezer']}/freezer.state", "THAWED")

    def frozen(self) -> bool:
        if self.v2_dir is not None:
            return _keyed(f"{self.v2_dir}/cgroup.events").get("frozen") == 1
        if "freezer" in self.v1_dirs:
            with contextlib.suppress(FileNotFoundError):
                return _read_text(f"{self.v1_dirs['freezer']}/freezer.state").strip() == "FROZEN"
        return False

    def oom_kills(self) -> int:
        if self.layout.source("memory") == "v1":
            return _keyed(f"{self.v1_dirs['memory']}/memory.oom_control").get("oom_kill", 0)
        if self.v2_dir is not None:
            return _keyed(f"{self.v2_dir}/memory.events").get("oom_kill", 0)
        return 0

    def stats(self) -> CgroupStats:
        if self.layout.source("memory") == "v1":
            mem = self.v1_dirs["memory"]
            memory = _read_int(f"{mem}/memory.usage_in_bytes")
            peak = _read_int(f"{mem}/memory.max_usage_in_bytes")
            cache = _keyed(f"{mem}/memory.stat").get("total_cache", 0)
        else:
            assert self.v2_dir is not None
            memory = _read_int(f"{self.v2_dir}/memory.current")
            peak = _read_int(f"{self.v2_dir}/memory.peak", memory)
            cache = _keyed(f"{self.v2_dir}/memory.stat").get("file", 0)
        if "cpuacct" in self.v1_dirs:
            cpu_ns = _read_int(f"{self.v1_dirs['cpuacct']}/cpuacct.usage")
        elif self.v2_dir is not None:
            # cpu.stat exists in every v2 cgroup (usage_usec is core accounting, no controller needed).
            cpu_ns = _keyed(f"{self.v2_dir}/cpu.stat").get("usage_usec", 0) * 1000
        else:
            cpu_ns = 0
        if self.layout.source("pids") == "v1":
            pids = _read_int(f"{self.v1_dirs['pids']}/pids.current")
        elif self.v2_dir is not None:
            pids = _read_int(f"{self.v2_dir}/pids.current")
        else:
            pids = len(self.procs())
        return CgroupStats(cpu_ns, memory, peak, pids, self.oom_kills(), cache)

    def remove(self) -> None:
        """rmdir every directory (idempotent). Raises OSError(EBUSY) if a cgroup still has processes."""
        for path in self._dirs():
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    raise
                raise


def remove_parent_if_empty(layout: CgroupLayout, parent: str) -> None:
    """Remove the ``parent`` directories when no sandbox cgroup is left (used by tests and tooling)."""
    for root in layout.roots:
        with contextlib.suppress(OSError):
            (root / parent.strip("/")).rmdir()
