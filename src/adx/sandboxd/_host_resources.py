"""What the host has: memory, CPUs, the disks under sandboxd's directories, and bytes a directory tree takes."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from adx.sandboxd._config import SandboxdConfig
from adx.sandboxd._devices import device_inventory
from adx.sandboxd._models import DeviceInfo, ResourceInfo, Resources

__all__ = ["measure_capacity", "meminfo_total", "read_resource", "tree_bytes"]


def meminfo_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def _whole_device(dev: int) -> str:
    major, minor = os.major(dev), os.minor(dev)
    sysdir = Path(f"/sys/dev/block/{major}:{minor}")
    if (sysdir / "partition").exists():
        with contextlib.suppress(OSError):
            return (sysdir.resolve().parent / "dev").read_text().strip()
    return f"{major}:{minor}"


def tree_bytes(root: Path) -> int:
    """Allocated bytes under ``root`` (like du; hard links counted once), without following symlinks."""
    total, seen, stack = 0, set(), [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return total


def measure_capacity(config: SandboxdConfig) -> Resources:
    """What sandboxes may reserve: the configured capacity, else the host's CPUs, memory and state disk."""
    cap = config.capacity
    st = os.statvfs(config.state_dir)
    return Resources(
        cpu_millis=cap.cpu_millis or (len(os.sched_getaffinity(0)) * 1000),
        memory_bytes=cap.memory_bytes or meminfo_total(),
        pids_max=0,
        disk_bytes=cap.disk_bytes or st.f_blocks * st.f_frsize,
    )


def read_resource(config: SandboxdConfig, capacity: Resources, reserved: Resources, sandboxes: int) -> ResourceInfo:
    """A resource sample (blocking: statvfs, /proc, /sys)."""
    st = os.statvfs(config.state_dir)
    devices = []
    for path in [config.state_dir, *config.artifact_roots().values()]:
        with contextlib.suppress(OSError):
            devices.append(DeviceInfo(path=str(path), dev=_whole_device(os.stat(path).st_dev)))
    return ResourceInfo(
        cpu_cores=len(os.sched_getaffinity(0)),
        memory_bytes=meminfo_total(),
        storage_bytes=st.f_blocks * st.f_frsize,
        storage_free_bytes=st.f_bavail * st.f_frsize,
        devices=devices,
        device_ids=device_inventory(config.devices, config.devices_file),
        capacity=capacity,
        reserved=reserved,
        sandboxes=sandboxes,
        observed_at=time.time(),
    )
