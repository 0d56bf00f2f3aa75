"""User namespaces: each sandbox's root is an unprivileged host ID range of its own.

sandboxd owns a subordinate ID range (``id_range`` in its config, like a line of ``/etc/subuid``) and gives
each sandbox a slice of :data:`IDS_PER_SANDBOX` IDs: uid and gid ``n`` inside are host ``id_base + n``. The
slice is recorded in the sandbox's record (``id_base``), so an adopting sandboxd after a restart knows it and
never hands it out twice; a deleted sandbox's slice stays taken until its cgroup is reclaimed (no process of
it can remain to reach the next owner's files).

The supervisor clones the init into the user namespace and writes its maps; the image's read-only layers and
host binds are idmapped (``_mounts._build_mounts``). The upper layer stores files with the sandbox's host
IDs, so a layer restored into a sandbox with another slice is shifted here (:func:`shift_tree`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from adx.errors import ConflictError

__all__ = ["IDS_PER_SANDBOX", "allocate", "shift_tree", "unsupported_reason"]

#: A sandbox's IDs: 0..65535 inside, enough for every ordinary account (nobody is 65534).
IDS_PER_SANDBOX = 65536


def unsupported_reason() -> str | None:
    """Why this host cannot run sandboxes in user namespaces (None: it can)."""
    if not os.path.exists("/proc/self/ns/user"):
        return "the kernel has no user namespaces"
    try:
        with open("/proc/sys/user/max_user_namespaces") as f:
            if int(f.read()) <= 0:
                return "user namespaces are disabled (user.max_user_namespaces = 0)"
    except (OSError, ValueError):
        pass
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    if (major, minor) < (6, 13):
        # idmapped layers under overlayfs (5.19) and layers given by descriptor (6.13), which keep host paths
        # out of the mount options.
        return f"kernel {os.uname().release} is older than 6.13"
    return None


def allocate(used: Iterable[int], start: int, count: int, prefer: int | None = None) -> int:
    """The ``id_base`` of a free slice of ``[start, start + count)``: ``prefer`` when it is a free slice (a
    restore gets its checkpoint's own slice back, so its layer needs no shifting), else the lowest free one."""
    taken = set(used)
    slots = count // IDS_PER_SANDBOX
    if prefer is not None and prefer not in taken and _is_slice(prefer, start, slots):
        return prefer
    for index in range(slots):
        base = start + index * IDS_PER_SANDBOX
        if base not in taken:
            return base
    raise ConflictError(
        f"subordinate ID range {start}+{count} is exhausted ({slots} sandboxes)",
        details={"resource": "id_range", "sandboxes": slots},
    )


def _is_slice(base: int, start: int, slots: int) -> bool:
    offset = base - start
    return offset >= 0 and offset % IDS_PER_SANDBOX == 0 and offset // IDS_PER_SANDBOX < slots


def _shifted(value: int, old: int | None, new: int | None) -> int:
    inside = value - (old or 0)
    if not 0 <= inside < IDS_PER_SANDBOX:
        return value  # not the sandbox's (e.g. overlayfs whiteouts, made by host root): kept
    return (new or 0) + inside


def shift_tree(root: str, old: int | None, new: int | None) -> int:
    """Re-own every entry under ``root`` (itself included, symlinks not followed) from the slice at ``old`` to
    the one at ``new`` (None: no user namespace, IDs as they are inside). Returns how many entries changed.

    A chown clears setuid/setgid bits and file capabilities: they are put back (mode by chmod, the
    ``security.capability`` xattr as it was). Capabilities set inside a user namespace are stored as v3 naming
    the old slice's root, and then apply to no process of the new one: a known limit (rare in a layer)."""
    changed = 0
    if old == new:
        return changed

    def fix(path: str) -> None:
        nonlocal changed
        st = os.lstat(path)
        uid, gid = _shifted(st.st_uid, old, new), _shifted(st.st_gid, old, new)
        if (uid, gid) == (st.st_uid, st.st_gid):
            return
        caps = None
        if not os.path.islink(path):
            try:
                caps = os.getxattr(path, "security.capability", follow_symlinks=False)
            except OSError:
                caps = None
        os.chown(path, uid, gid, follow_symlinks=False)
        if not os.path.islink(path):
            if st.st_mode & 0o6000:
                os.chmod(path, st.st_mode & 0o7777)
            if caps is not None:
                os.setxattr(path, "security.capability", caps, follow_symlinks=False)
        changed += 1

    fix(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            fix(os.path.join(dirpath, name))
    return changed
