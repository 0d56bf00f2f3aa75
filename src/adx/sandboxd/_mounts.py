"""The sandbox's mounts, built by the supervisor as detached mount descriptors and handed to its init.

The supervisor builds them as host root (an idmapped mount and the overlay over it need privilege over the
host's filesystems, which the init in its user namespace lacks) and sends them over a socket pair; the init
moves the n-th descriptor it receives to the n-th target of :func:`mount_plan`.
"""

from __future__ import annotations

import os
import socket

from adx.sandboxd import _linux as lx
from adx.sandboxd import _mount_api as mapi
from adx.sandboxd._sandbox_layout import CONTROL_DIR_INSIDE
from adx.sandboxd._spawn_spec import SpawnSpec

__all__ = ["mount_plan", "mounts_pair", "receive_mounts", "send_mounts"]

#: Mount kinds of :func:`mount_plan`, and the attributes of each (only ever added to the host mount's).
_RO = mapi.MOUNT_ATTR_RDONLY | mapi.MOUNT_ATTR_NOSUID | mapi.MOUNT_ATTR_NODEV
_ATTRS = {
    "image": mapi.MOUNT_ATTR_RDONLY | mapi.MOUNT_ATTR_NODEV,  # the image's host dirs (/usr): setuid sudo works
    "ro": _RO,
    "control": _RO | mapi.MOUNT_ATTR_NOEXEC,
    "run": mapi.MOUNT_ATTR_NOSUID | mapi.MOUNT_ATTR_NODEV,
    "volume": mapi.MOUNT_ATTR_NOSUID | mapi.MOUNT_ATTR_NODEV,  # a tenant's named volume, read-write
}


def mount_plan(spec: SpawnSpec) -> list[tuple[str, str, str]]:
    """``(target inside, host source, kind)`` of every mount the supervisor builds detached, in order (the
    root first). The same list on both sides: the init moves the n-th descriptor it receives to the n-th target.
    """
    plan = [("", "", "overlay")]
    plan += [(host_dir, host_dir, "image") for host_dir in spec.image_binds]
    if spec.run_dir:
        plan.append(("/run/adx", spec.run_dir, "run"))
    if spec.control_dir:
        # Read-only: the sandbox can connect to the hub's socket but never replace it (sockets are exempt
        # from EROFS on connect); only sandboxd, on the host, (re)binds it.
        plan.append((CONTROL_DIR_INSIDE, spec.control_dir, "control"))
    plan += [(inside, host_dir, "ro") for inside, host_dir in spec.ro_binds.items()]
    # Volumes last: a mount point under another mount (a ro_bind's) would otherwise be covered by it.
    plan += [(inside, host_dir, "volume") for inside, host_dir in sorted(spec.volume_binds.items())]
    return plan


def _build_mounts(spec: SpawnSpec, pid: int) -> list[int]:
    """The sandbox's mounts as detached mount descriptors, in :func:`mount_plan` order (here, as host root:
    an idmapped mount and the overlay over it need privilege over the host's filesystems, which the init in
    its user namespace lacks). With a user namespace, first its ID maps (the init waits for the mounts, so
    it never runs unmapped), and the sandbox's own dirs (upper layer, run dir) become its root's.

    Read-only host trees (image layers, image binds, ro_binds, the control dir) are idmapped: host root's files
    are the sandbox root's. So are volumes, read-write: a file on disk owned by N is the sandbox's N, and what the
    sandbox writes is stored as its own IDs unshifted, so any sandbox (whatever its host ID slice) and the content
    API see the same owners. The upper layer and run dir are not: their files are stored with the sandbox's host
    IDs, which its namespace maps to its own.
    """
    userns = spec.userns
    uns_fd = None
    fds: list[int] = []
    try:
        if userns is not None:
            base, size = int(userns.base), int(userns.size)
            lx.write_id_maps(pid, base, size)
            uns_fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            for own in (spec.upper_dir, spec.run_dir):
                if own and os.stat(own).st_uid == 0:  # fresh (a restored layer was shifted by sandboxd)
                    os.chown(own, base, base)
        for _, source, kind in mount_plan(spec):
            if kind == "overlay":
                fds.append(_build_overlay(spec, uns_fd))
            elif kind == "ro":
                fds.append(_read_only_overlay(spec, source, uns_fd))
            else:
                fds.append(mapi.detached_bind(source, _ATTRS[kind], uns_fd if kind != "run" else None))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        if uns_fd is not None:
            os.close(uns_fd)
    return fds


def _build_overlay(spec: SpawnSpec, uns_fd: int | None) -> int:
    """The sandbox's root: an overlay of the image's read-only layers (``image_root``, colon-joined) and its
    own upper layer, detached. Lowers go by descriptor, upper and work dir by names relative to their common
    parent (our cwd meanwhile): /proc/mounts inside shows ``lowerdir+=/,upperdir=upper,workdir=ovlwork``."""
    upper = spec.upper_dir or f"{spec.sandbox_dir}/upper"
    work = spec.work_dir or f"{spec.sandbox_dir}/ovlwork"
    parent = os.path.dirname(upper)
    if os.path.dirname(work) != parent:
        raise OSError(f"upper and work dir must share a parent: {upper}, {work}")
    lowers: list[int] = []
    try:
        for layer in spec.image_root.split(":"):
            lowers.append(mapi.detached_bind(layer, mapi.MOUNT_ATTR_RDONLY, uns_fd, recursive=False))
        os.chdir(parent)
        # xino=off, index=off: no inode-number composition or index bookkeeping (measurably faster mounts);
        # the layers share one filesystem here, so (st_dev, st_ino) stay unique anyway.
        options = {"xino": "off", "index": "off"}
        return mapi.detached_overlay(
            lowers, os.path.basename(upper), os.path.basename(work), options, mapi.MOUNT_ATTR_NODEV
        )
    finally:
        os.chdir("/")
        for fd in lowers:
            os.close(fd)


def _read_only_overlay(spec: SpawnSpec, source: str, uns_fd: int | None) -> int:
    """A host dir (``ro_binds``: execd's runtime, an operator's dirs) as a read-only overlay of it and an empty
    dir (the sandbox's rootfs mount point, empty on the host): a filesystem of its own, so the mount table
    inside shows ``/`` where a bind would show the host path of its source. Files only: a Unix socket is not
    reachable through overlayfs (the control dir stays a bind)."""
    lowers: list[int] = []
    try:
        for layer in (source, f"{spec.sandbox_dir}/rootfs"):
            lowers.append(mapi.detached_bind(layer, mapi.MOUNT_ATTR_RDONLY, uns_fd, recursive=False))
        return mapi.detached_overlay(lowers, None, None, {}, _ATTRS["ro"])
    finally:
        for fd in lowers:
            os.close(fd)


def send_mounts(sock_fd: int, spec: SpawnSpec, pid: int) -> str | None:
    """Build the mounts and send them to the init (closing ``sock_fd``); the error, if that failed (the init
    then gets none and fails its setup)."""
    error = None
    fds: list[int] = []
    try:
        fds = _build_mounts(spec, pid)
    except OSError as exc:
        error = f"preparing the sandbox's mounts failed: {exc}"
    sock = socket.socket(fileno=sock_fd)
    try:
        socket.send_fds(sock, [b"1" if error is None else b"0"], fds)
    except OSError as exc:
        error = error or f"handing the mounts to the sandbox's init failed: {exc}"
    finally:
        sock.close()
        for fd in fds:
            os.close(fd)
    return error


def receive_mounts(sock_fd: int) -> list[int]:
    sock = socket.socket(fileno=sock_fd)
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 1, 64)
    finally:
        sock.close()
    if msg != b"1":
        raise OSError("the supervisor could not prepare the sandbox's mounts")
    return fds


def mounts_pair() -> tuple[int, int]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return a.detach(), b.detach()  # close-on-exec, as every socket Python makes
