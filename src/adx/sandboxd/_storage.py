"""Enforced disk: each sandbox's writable layer is a btrfs subvolume with a qgroup limit.

The host root here is ext4 without usable project quotas, so sandboxd owns a filesystem of its own: a sparse
image file formatted btrfs, loop-mounted. Both the image and its mount point lie *beside* the state dir
(``<state_dir>.storage.img``, ``<state_dir>.storage``), never inside it: the registry, spares and tests walk
the state dir, and nothing may read the (sparse, tens of GiB) image. Under the mount, ``sbx/<sandbox_id>`` is a
subvolume holding the overlay's ``upper`` and ``ovlwork`` (overlayfs wants both on one filesystem); its qgroup
limit is the sandbox's ``disk`` request, counted in referenced bytes.

The mount outlives sandboxd (sandboxd survives its own restarts): ``ensure`` adopts a mount that is already
there, and only ``unmount`` (tests, operators) takes it down.

Limits the kernel imposes: a write past a qgroup limit fails with ``EDQUOT`` ("Disk quota exceeded"), not
``ENOSPC``, and ``statfs``/``df`` inside report the whole pool, not the limit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adx.errors import ConflictError, InvalidInputError, UnavailableError
from adx.sandboxd import _btrfs

__all__ = ["Snapshot", "StoragePool", "mounted", "pool_paths", "pool_unsupported_reason", "unmount_pool"]

_SBX = "sbx"
_CKPT = "ckpt"


def pool_paths(state_dir: Path) -> tuple[Path, Path]:
    """(image file, mount point), both beside ``state_dir``."""
    base = state_dir.absolute()
    return base.with_name(base.name + ".storage.img"), base.with_name(base.name + ".storage")


def pool_unsupported_reason() -> str | None:
    """Why this host cannot have a pool (None: it can, as far as can be told before trying to mount one)."""
    missing = [tool for tool in ("mkfs.btrfs", "btrfs") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (Debian package btrfs-progs)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control is missing)"
    with open("/proc/filesystems", encoding="utf-8") as f:
        known = any(line.split()[-1] == "btrfs" for line in f if line.strip())
    if not known and subprocess.run(["modprobe", "btrfs"], capture_output=True, check=False).returncode != 0:
        return "the kernel has no btrfs (not in /proc/filesystems, and modprobe btrfs failed)"
    return None


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise UnavailableError(f"disk quotas need {argv[0]} (Debian package btrfs-progs)") from None
    if done.returncode != 0:
        raise UnavailableError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return done.stdout


def _ioctl(what: str, call: Callable[[str], None], path: Path) -> None:
    """One of ``_btrfs``'s ioctls on ``path``; its OSError as the UnavailableError ``_run`` would give."""
    try:
        call(str(path))
    except OSError as exc:
        raise UnavailableError(f"{what} {path} failed: {exc}") from exc


def mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point in this process's mount table (read, not stat'ed: a pool whose loop
    device is gone still shows there and must still be unmounted)."""
    target = str(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        # Field 5 is the mount point (octal escapes for spaces; our paths have none).
        return any(line.split(" ", 5)[4] == target for line in f)


def unmount_pool(mount: Path, *, lazy: bool = False) -> bool:
    """Unmount the pool at ``mount`` if it is mounted (the loop device was set up with autoclear and goes with
    it); whether it was. ``lazy``: detach now even while sandboxes still hold files in it."""
    if not mounted(mount):
        return False
    _run(["umount", *(["-l"] if lazy else []), str(mount)])
    return True


def _sweep(root: Path, keep: set[str], delete: Callable[[str], None]) -> list[str]:
    """Delete (with ``delete``) every entry of ``root`` not named in ``keep``; the names deleted, sorted."""
    removed: list[str] = []
    if root.is_dir():
        for entry in sorted(root.iterdir()):
            if entry.name not in keep:
                delete(entry.name)
                removed.append(entry.name)
    return removed


@dataclass(frozen=True)
class Snapshot:
    uuid: str
    size_bytes: int | None  # None: the qgroup could not be read; the caller measures the tree


@dataclass(frozen=True)
class StoragePool:
    image: Path
    mount: Path
    image_bytes: int

    def ensure(self) -> None:
        """Create (sparse), format and mount the pool, or adopt the mount an earlier run left."""
        self.mount.mkdir(mode=0o700, exist_ok=True)
        if not mounted(self.mount):
            if not self.image.exists():
                tmp = self.image.with_name(self.image.name + ".tmp")
                with open(tmp, "wb") as f:
                    f.truncate(self.image_bytes)  # sparse: costs only what is written
                _run(["mkfs.btrfs", "-q", "-f", str(tmp)])
                os.rename(tmp, self.image)  # a half-formatted image never carries the final name
            _run(["mount", "-o", "loop,noatime", str(self.image), str(self.mount)])
        _run(["btrfs", "quota", "enable", str(self.mount)])  # idempotent
        (self.mount / _SBX).mkdir(mode=0o700, exist_ok=True)

    def unmount(self) -> None:
        unmount_pool(self.mount)

    def subvolume(self, sandbox_id: str) -> Path:
        return self.mount / _SBX / sandbox_id

    def upper(self, sandbox_id: str) -> Path:
        return self.subvolume(sandbox_id) / "upper"

    def workdir(self, sandbox_id: str) -> Path:
        return self.subvolume(sandbox_id) / "ovlwork"

    def create(self, sandbox_id: str, limit_bytes: int) -> Path:
        """The sandbox's subvolume with ``upper``/``ovlwork`` and its limit; an earlier leftover is replaced."""
        if limit_bytes <= 0:
            raise InvalidInputError("resources.disk_bytes", "must be positive when disk quotas are on")
        sub = self.subvolume(sandbox_id)
        if sub.exists():
            self.delete(sandbox_id)
        # ioctls, not btrfs-progs: two fork+execs fewer on every cold create (_btrfs).
        _ioctl("btrfs subvolume create", _btrfs.subvolume_create, sub)
        try:
            _ioctl("btrfs qgroup limit", lambda p: _btrfs.qgroup_limit(p, limit_bytes), sub)
            (sub / "upper").mkdir(mode=0o755)
            (sub / "ovlwork").mkdir(mode=0o700)
        except BaseException:
            self.delete(sandbox_id)
            raise
        return sub

    def delete(self, sandbox_id: str) -> None:
        sub = self.subvolume(sandbox_id)
        if not sub.exists():
            return
        # The overlay work dir holds a mode-000 dir; a subvolume delete removes it all in one call.
        try:
            _ioctl("btrfs subvolume delete", _btrfs.subvolume_delete, sub)
        except UnavailableError:
            shutil.rmtree(sub)  # not a subvolume (a half-made create): a plain directory

    def sweep_layers(self, keep: set[str]) -> list[str]:
        """Delete the layer subvolumes of sandbox IDs not in ``keep`` (startup only).

        A restore makes its writable snapshot while the new record's commit runs beside it, so a crash before
        the commit leaves a layer no record names; the registry only blocks such an ID, and nothing else would
        ever delete its subvolume."""
        return _sweep(self.mount / _SBX, keep, self.delete)

    # == local checkpoints as read-only snapshots =============================================================
    # A pause of a large layer costs metadata, not a copy: the checkpoint is a read-only snapshot of the
    # sandbox's subvolume under ``ckpt/<checkpoint_id>``; a restore is a writable snapshot of that.

    def snapshot_path(self, name: str) -> Path:
        return self.mount / _CKPT / name

    def snapshot(self, sandbox_id: str, name: str) -> Snapshot:
        """Read-only snapshot of the sandbox's layer: its btrfs UUID (recorded in the manifest) and size."""
        (self.mount / _CKPT).mkdir(mode=0o700, exist_ok=True)
        target = self.snapshot_path(name)
        _run(["btrfs", "subvolume", "snapshot", "-r", str(self.subvolume(sandbox_id)), str(target)])
        try:
            uuid, subvolume_id = self._show(target)
            return Snapshot(uuid, self._referenced(subvolume_id))
        except BaseException:
            self.delete_snapshot(name)
            raise

    def uuid(self, path: Path) -> str:
        return self._show(path)[0]

    def _show(self, path: Path) -> tuple[str, int]:
        """(UUID, subvolume ID) of the subvolume at ``path``."""
        fields: dict[str, str] = {}
        for line in _run(["btrfs", "subvolume", "show", str(path)]).splitlines():
            key, _, value = line.strip().partition(":")
            fields.setdefault(key, value.strip())
        try:
            return fields["UUID"], int(fields["Subvolume ID"])
        except (KeyError, ValueError):
            raise UnavailableError(f"btrfs reports no UUID or subvolume ID for {path}") from None

    def _referenced(self, subvolume_id: int) -> int | None:
        """Bytes the subvolume references, from its qgroup in sysfs (None when that cannot be read).

        Read instead of walking the layer's files, which costs ~0.25-0.4 s per 20,000 files. Creating the
        snapshot committed a transaction, which is when its qgroup got its numbers."""
        try:
            device = next(
                line.split(" - ", 1)[1].split()[1]
                for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if line.split(" ", 5)[4] == str(self.mount)
            )
            name = Path(device).name
            for fs in Path("/sys/fs/btrfs").iterdir():
                if (fs / "devices" / name).exists():
                    if (fs / "qgroups" / "inconsistent").read_text().strip() != "0":
                        return None  # numbers not trustworthy until a rescan
                    return int((fs / "qgroups" / f"0_{subvolume_id}" / "referenced").read_text())
        except (OSError, ValueError, IndexError, StopIteration):
            return None
        return None

    def restore(self, name: str, uuid: str, sandbox_id: str, limit_bytes: int) -> None:
        """The sandbox's layer as a writable snapshot of checkpoint ``name``, which must still be ``uuid``."""
        if limit_bytes <= 0:
            raise InvalidInputError("resources.disk_bytes", "must be positive when disk quotas are on")
        source = self.snapshot_path(name)
        if not source.exists():
            raise UnavailableError(f"checkpoint snapshot {name} is missing from the storage pool")
        if self.uuid(source) != uuid:
            raise ConflictError(f"checkpoint snapshot {name} is not the one its manifest names; refused")
        sub = self.subvolume(sandbox_id)
        if sub.exists():
            self.delete(sandbox_id)
        _run(["btrfs", "subvolume", "snapshot", str(source), str(sub)])
        try:
            _ioctl("btrfs qgroup limit", lambda p: _btrfs.qgroup_limit(p, limit_bytes), sub)
        except BaseException:
            self.delete(sandbox_id)
            raise

    def delete_snapshot(self, name: str) -> None:
        if self.snapshot_path(name).exists():
            _ioctl("btrfs subvolume delete", _btrfs.subvolume_delete, self.snapshot_path(name))

    def sweep_snapshots(self, referenced: set[str]) -> list[str]:
        """Delete the snapshots no whole artifact names (a capture or delete a crash interrupted)."""
        return _sweep(self.mount / _CKPT, referenced, self.delete_snapshot)
