"""Image build steps on the sandboxd side: an ended sandbox's writable layer becomes a store layer.

overlayfs leaves deletions in the upper layer as whiteouts (0/0 character devices) and replaced directories as
``trusted.overlay.opaque`` xattrs; both keep their meaning when the tree is mounted as a *lower* layer of the
next step, so the upper directory is committed as is (moved, or ``cp -a`` across filesystems).
"""

from __future__ import annotations

import os
from pathlib import Path

from adx.images import ImageStore, LayerInfo

__all__ = ["OUTPUT_TAIL_BYTES", "commit_upper", "output_tail"]

OUTPUT_TAIL_BYTES = 64 * 1024


def commit_upper(store: ImageStore, upper: Path, digest: str, parent: str | None, step: str) -> LayerInfo:
    if store.has_layer(digest):
        return store.layer_info(digest)  # the same step on the same parent: already there
    info = store.commit_tree(upper, digest, parent, step)
    # The sandbox dir's later removal expects its upper dir; an empty one (0755, like the one the sandbox had).
    upper.mkdir(mode=0o755, exist_ok=True)
    return info


def output_tail(path: Path) -> tuple[str, bool]:
    """The last ``OUTPUT_TAIL_BYTES`` of a sandbox's output log (decoded leniently), and whether it was cut."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - OUTPUT_TAIL_BYTES))
            data = f.read(OUTPUT_TAIL_BYTES)
    except FileNotFoundError:
        return "", False
    return data.decode(errors="replace"), size > OUTPUT_TAIL_BYTES
