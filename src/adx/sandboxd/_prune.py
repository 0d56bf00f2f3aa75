"""Orphaned sandboxes: what sandboxd left on this host after its state directory was removed.

Sandboxes outlive sandboxd (SBX-11: a restart adopts them), so removing a state directory — a temporary one, or
``rm -rf`` after trying ADX — leaves processes, cgroups and network tables that nothing will ever adopt. A
sandbox is found through its cgroup (``<hierarchy>/<cgroup_parent>/<sandbox_id>``) and proven orphaned through
its supervisor: the supervisor holds ``<state_dir>/sandboxes/<id>/lifecycle.lock`` open for the sandbox's whole
life, so its descriptor names the state directory, and the kernel marks it ``(deleted)`` once that is gone.
Only then is anything removed: a sandbox whose lock file exists belongs to a state directory (a live or
stopped sandboxd will adopt it), and one without a supervisor cannot be proven orphaned; both are kept.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from adx.sandboxd._cgroups import CgroupLayout, SandboxCgroup, detect_layout
from adx.sandboxd._netpolicy import table_name
from adx.sandboxd._sandbox_layout import LOCK_FILE

__all__ = ["Leftover", "find_orphans", "remove_orphan"]

DELETED = " (deleted)"


@dataclass
class Leftover:
    sandbox_id: str
    cgroup_parent: str
    state_dir: str  # the removed state directory the supervisor's lock names
    supervisor: int
    helpers: list[int] = field(default_factory=list)  # the supervisor's other children (an older version's pump)
    processes: list[int] = field(default_factory=list)  # in the sandbox's cgroup
    cgroup_dirs: list[str] = field(default_factory=list)
    nft_table: str | None = None  # the state directory's nftables table (veth egress policy), if present
    mounts: list[str] = field(default_factory=list)  # host mounts under the removed state directory


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ppid(int(entry)) == pid:
            out.append(int(entry))
    return out


def _lock_path(pid: int, sandbox_id: str) -> str | None:
    """The lifecycle lock the process holds for ``sandbox_id``, as the kernel names it (maybe ``(deleted)``)."""
    suffix = f"/sandboxes/{sandbox_id}/{LOCK_FILE}"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.removesuffix(DELETED).endswith(suffix):
                return target
    return None


def _nft_tables() -> set[str]:
    try:
        out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split()[-1] for line in out.stdout.splitlines() if line.startswith("table inet ")}


def _mounts_under(prefix: str) -> list[str]:
    points = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)  # innermost first


def _sandbox_ids(layout: CgroupLayout, parent: str) -> list[str]:
    ids: set[str] = set()
    for root in layout.roots:
        with contextlib.suppress(OSError):
            ids.update(e.name for e in os.scandir(root / parent.strip("/")) if e.is_dir(follow_symlinks=False))
    return sorted(ids)


def find_orphans(
    cgroup_parents: list[str], layout: CgroupLayout | None = None, *, owned_by: str | None = None
) -> list[Leftover]:
    """The sandboxes under ``cgroup_parents`` whose state directory no longer exists (read only).

    ``owned_by``: also those of this state directory (``adx down --delete``: its sandboxd is stopped and the
    user asked for every sandbox of it to go)."""
    layout = layout or detect_layout()
    tables = _nft_tables()
    found = []
    for parent in cgroup_parents:
        for sandbox_id in _sandbox_ids(layout, parent):
            cgroup = SandboxCgroup(layout, parent, sandbox_id)
            procs = cgroup.procs()
            supervisors = {p for p in (_ppid(pid) for pid in procs) if p is not None and p not in procs}
            for supervisor in supervisors:
                lock = _lock_path(supervisor, sandbox_id)
                if lock is None:
                    continue
                path = lock.removesuffix(DELETED)
                state_dir = path[: -len(f"/sandboxes/{sandbox_id}/{LOCK_FILE}")]
                if state_dir != owned_by:
                    if not lock.endswith(DELETED) and os.path.exists(path):
                        break  # its state directory exists: a sandboxd adopts it; never touched
                    if os.path.isdir(f"{state_dir}/sandboxes/{sandbox_id}"):
                        break  # recreated meanwhile: not provably orphaned
                table = table_name(Path(state_dir))
                found.append(
                    Leftover(
                        sandbox_id=sandbox_id,
                        cgroup_parent=parent,
                        state_dir=state_dir,
                        supervisor=supervisor,
                        helpers=[c for c in _children(supervisor) if c not in procs],
                        processes=sorted(procs),
                        cgroup_dirs=[str(d) for d in cgroup.dirs() if d.exists()],
                        nft_table=table if table in tables else None,
                        mounts=_mounts_under(state_dir),
                    )
                )
                break
    return found


def remove_orphan(leftover: Leftover, layout: CgroupLayout | None = None, timeout: float = 10.0) -> list[str]:
    """Remove what ``leftover`` names; returns what could not be removed (empty: all gone)."""
    layout = layout or detect_layout()
    problems = []
    # The supervisor first: it would otherwise record the exit and try to clean up in a directory that is gone.
    for pid in (leftover.supervisor, *leftover.helpers):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    cgroup = SandboxCgroup(layout, leftover.cgroup_parent, leftover.sandbox_id)
    try:
        cgroup.kill()  # the PID namespace, its network namespace and so the veth pair go with its processes
        if not cgroup.wait_empty(timeout):
            problems.append(f"processes {sorted(cgroup.procs())} still run after {timeout:g}s")
        cgroup.remove()
    except OSError as exc:
        problems.append(f"cgroup: {exc}")
    if leftover.nft_table is not None:
        out = subprocess.run(
            ["nft", "delete", "table", "inet", leftover.nft_table], capture_output=True, text=True, check=False
        )
        if out.returncode != 0 and "No such file" not in out.stderr:
            problems.append(f"nftables table {leftover.nft_table}: {out.stderr.strip()}")
    for point in leftover.mounts:
        out = subprocess.run(["umount", "--lazy", point], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            problems.append(f"mount {point}: {out.stderr.strip()}")
    return problems
