"""Where a node's capacity comes from (RES-1..3) and how fresh it is (RES-6).

Sources: ``auto`` reads this machine (CPU parallelism, cpuset, cgroup v1/v2 hierarchical CPU and memory
limits, free space on a path); ``capacity_file`` reads a JSON file an operator maintains; ``sandboxd`` asks
the sandbox daemon's Resource call (wired by the node once sandboxd is its runtime). None of them ever
invents accelerators.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from adx.errors import UnavailableError
from adx.model import Resources, parse_wire

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 2**62  # cgroup v1 reports "no limit" as a page-rounded 2^63-1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, PermissionError, OSError):
        return None


def _cgroup_paths(proc_cgroup: str) -> tuple[dict[str, str], str | None]:
    """Map v1 controller -> path, and the v2 unified path, from /proc/self/cgroup text."""
    v1: dict[str, str] = {}
    unified = None
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            unified = path
        for controller in controllers.split(","):
            v1[controller] = path
    return v1, unified


def _ancestors(base: Path, path: str) -> list[Path]:
    """``base/path`` and each parent up to ``base``: limits are hierarchical, the tightest one wins."""
    parts = [p for p in path.split("/") if p]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def cpu_limit_millis(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int:
    """CPU this process may use, in millicores: min(affinity/cpuset size, every cgroup quota above us)."""
    millis = len(os.sched_getaffinity(0)) * 1000
    v1, unified = _cgroup_paths(proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text())
    if unified is not None and (root / "cgroup.controllers").exists():
        for directory in _ancestors(root, unified):
            text = _read(directory / "cpu.max")
            if text and not text.startswith("max"):
                quota, period = (int(x) for x in text.split())
                millis = min(millis, math.floor(quota * 1000 / period))
    if "cpu" in v1:
        for directory in _ancestors(root / "cpu", v1["cpu"]):
            quota_text, period_text = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
            if quota_text and period_text and int(quota_text) > 0:
                millis = min(millis, math.floor(int(quota_text) * 1000 / int(period_text)))
    return max(millis, 0)


def memory_limit_bytes(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int:
    """Memory this process's cgroups may use: min(MemTotal, every cgroup memory limit above us)."""
    meminfo = Path("/proc/meminfo").read_text()
    total = next(int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemTotal:"))
    limit = total
    v1, unified = _cgroup_paths(proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text())
    if unified is not None and (root / "cgroup.controllers").exists():
        for directory in _ancestors(root, unified):
            text = _read(directory / "memory.max")
            if text and text != "max":
                limit = min(limit, int(text))
    if "memory" in v1:
        for directory in _ancestors(root / "memory", v1["memory"]):
            text = _read(directory / "memory.limit_in_bytes")
            if text and int(text) < UNLIMITED:
                limit = min(limit, int(text))
    return limit


def disk_free_bytes(path: Path) -> int:
    try:
        stat = os.statvfs(path)
    except OSError as exc:
        raise UnavailableError(f"cannot read free space of {path}: {exc.strerror}") from None
    return stat.f_bavail * stat.f_frsize


def read_auto(disk_path: Path) -> Resources:
    """RES-3: this machine's CPU, memory and free disk, cgroup-aware. No GPUs/NPUs are ever reported."""
    return Resources(
        cpu_millis=cpu_limit_millis(), memory_bytes=memory_limit_bytes(), disk_bytes=disk_free_bytes(disk_path)
    )


@dataclass(frozen=True)
class Reading:
    """A capacity sample with the whole-device IDs the source lists (RES-2/RES-8); never invented (RES-3)."""

    capacity: Resources
    devices: tuple[str, ...] = ()


def read_capacity_file(path: Path) -> Resources:
    """A JSON object ``{"cpuMillis": .., "memoryBytes": .., "diskBytes": ..}`` maintained by an operator."""
    return read_capacity_file_devices(path).capacity


def read_capacity_file_devices(path: Path) -> Reading:
    """The capacity file, which may also list whole-device IDs: ``"devices": ["gpu0", ...]`` (RES-8)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UnavailableError(f"capacity file {path} not found") from None
    except (OSError, ValueError) as exc:
        raise UnavailableError(f"capacity file {path} is unreadable: {exc}") from None
    devices: tuple[str, ...] = ()
    if isinstance(data, dict) and "devices" in data:
        listed = data.pop("devices")
        if not isinstance(listed, list) or not all(isinstance(item, str) and item for item in listed):
            raise UnavailableError(f"capacity file {path}: devices must be a list of non-empty device ID strings")
        devices = tuple(dict.fromkeys(listed))
    return Reading(parse_wire(Resources, data, "capacity"), devices)


@dataclass(frozen=True)
class Sample:
    capacity: Resources
    taken_at: float
    valid_until: float
    devices: tuple[str, ...] = ()


class CapacityTracker:
    """RES-6: the latest valid sample and the two separate flags derived from it.

    - No valid first sample: not fresh, admission closed (the node waits before registering capacity).
    - A failed read keeps the previous sample until its *own* validity ends (a failure never renews it).
    - ``fresh`` = a sample is within its validity; ``admission_open`` additionally requires no pressure
      restriction. A fresh zero sample is fresh and open, but satisfies no positive request.
    """

    def __init__(self, read: Callable[[], Awaitable[Resources | Reading]], valid_for: float) -> None:
        self._read = read
        self.valid_for = valid_for
        self.sample: Sample | None = None
        self.last_error: str | None = None
        self.pressure_closed = False
        self.pressure_reason = ""  # RES-7: why pressure holds admission closed ("" while it does not)

    async def refresh(self, now: float | None = None) -> Sample | None:
        now = time.time() if now is None else now
        try:
            read = await self._read()
        except UnavailableError as exc:
            self.last_error = str(exc)
            return self.sample
        reading = read if isinstance(read, Reading) else Reading(read)
        self.last_error = None
        self.sample = Sample(reading.capacity, now, now + self.valid_for, reading.devices)
        return self.sample

    def fresh(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return self.sample is not None and self.sample.valid_until >= now

    def admission_open(self, now: float | None = None) -> bool:
        return self.fresh(now) and not self.pressure_closed

    def closed_reason(self, now: float | None = None) -> str:
        """Why admission is closed by resources ("" when open): no/expired sample (RES-6) or pressure (RES-7)."""
        if self.sample is None:
            return "no valid capacity sample yet" + (f" ({self.last_error})" if self.last_error else "")
        if not self.fresh(now):
            return "capacity sample expired" + (f" ({self.last_error})" if self.last_error else "")
        return self.pressure_reason if self.pressure_closed else ""
