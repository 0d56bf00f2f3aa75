"""Image build steps on the sandboxd side: an ended sandbox's writable layer becomes a store layer.

overlayfs leaves deletions in the upper layer as whiteouts (0/0 character devices) and replaced directories as
``trusted.overlay.opaque`` xattrs; both keep their meaning when the tree is mounted as a *lower* layer of the
next step, so the upper directory is committed as is (moved, or ``cp -a`` across filesystems).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from adx.errors import ConflictError, UnavailableError
from adx.images import TYPICAL_BUILD_SECONDS, ImageStore, LayerInfo, ensure_debian_image, layer_digest
from adx.sandboxd._faults import fault

__all__ = ["OUTPUT_TAIL_BYTES", "BaseImageBuilder", "commit_upper", "ensure_mountpoints", "output_tail"]

log = logging.getLogger("adx.sandboxd.images")

OUTPUT_TAIL_BYTES = 64 * 1024

#: Directories sandboxd mounts on (proc, dev, execd's runtime and sockets, /work). Images need not have them
#: (mmdebstrap empties /run; an imported image may lack /work): this layer sits *below* every store image, so
#: it only adds what the image lacks and the image's own owner and mode win where it has the directory.
_MOUNTPOINTS = ("proc", "dev", "tmp", "run/adx", "run/adx-control", "opt/adx", "work")
_MOUNTPOINTS_STEP = f"adx mount points v1: {' '.join(_MOUNTPOINTS)}"


def ensure_mountpoints(store: ImageStore) -> str:
    """The mount-point layer's digest, made when the store lacks it (a few empty directories)."""
    digest = layer_digest(None, _MOUNTPOINTS_STEP)
    if not store.has_layer(digest):
        staging = store.staging()
        for rel in _MOUNTPOINTS:
            (staging / "tree" / rel).mkdir(parents=True, mode=0o755, exist_ok=True)
        os.chmod(staging / "tree" / "tmp", 0o1777)
        store.commit_layer(staging, digest, None, _MOUNTPOINTS_STEP)
    return digest


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


class BaseImageBuilder:
    """``base_image = "debian"``: the store's ``base`` is the Debian image, built in a thread at start when the
    store lacks it (the daemon serves meanwhile; creates of ``base`` get a 503 saying how far it is)."""

    def __init__(self, store: ImageStore) -> None:
        self.store = store
        self.error: str | None = None
        self.last_line = "starting"
        self.started = 0.0
        self._done = threading.Event()

    def start(self) -> None:
        self.started = time.monotonic()
        threading.Thread(target=self._run, name="base-image", daemon=True).start()

    def _progress(self, line: str) -> None:
        self.last_line = line
        log.info("base image: %s", line)

    def _run(self) -> None:
        try:
            if self.store.find("base") is None or self.store.find("debian") is None:
                log.warning(
                    "building the Debian base image (first start with base_image = 'debian'; usually ~%ds); "
                    "creates of 'base' wait for it",
                    TYPICAL_BUILD_SECONDS,
                )
            fault("base_image.build")
            manifest, _ = ensure_debian_image(self.store, "debian", progress=self._progress)
            self.store.put(manifest.model_copy(update={"name": "base"}))
        except Exception as exc:  # reported by every create of base, and in the log
            self.error = str(exc)
            log.error("the Debian base image could not be built: %s", exc)
        finally:
            self._done.set()

    def check_ready(self) -> None:
        if not self._done.is_set():
            elapsed = time.monotonic() - self.started
            raise UnavailableError(
                f"the base image is being built ({elapsed:.0f}s of usually ~{TYPICAL_BUILD_SECONDS}s: "
                f"{self.last_line}); retry later",
                details={"retry_after_seconds": 10},
            )
        if self.error is not None:
            # Not a 503: nothing changes until sandboxd restarts (a retried start would only wait out the node's
            # readiness budget before failing with the same reason).
            raise ConflictError(f"the Debian base image could not be built: {self.error}; restart sandboxd to retry")
