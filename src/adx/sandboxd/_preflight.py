"""Native checks before the API is bound: cgroup parents, images, the storage pool, artifact roots, execd's
runtime, user namespaces and capacity; and where a sandbox's executables come from (in-process execd)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from adx.errors import UnavailableError
from adx.execd._launch import install_runtime
from adx.sandboxd import _checkpoint as ckpt
from adx.sandboxd._control_sockets import ControlSockets
from adx.sandboxd._host_resources import measure_capacity
from adx.sandboxd._image import ensure_default_image, load_image
from adx.sandboxd._models import ExecdOptions
from adx.sandboxd._storage import StoragePool, pool_paths, pool_unsupported_reason
from adx.sandboxd._userns import unsupported_reason

__all__ = ["HostPreflight"]

log = logging.getLogger("adx.sandboxd")

#: A sandbox's default PATH.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HostPreflight(ControlSockets):
    """Startup checks of the host (SBX-10: native preflight before the API is bound)."""

    def _preflight(self) -> None:
        """Native checks after storage init and before the API is bound."""
        for d in self._cgroup_parents():
            d.mkdir(parents=True, exist_ok=True)
        image = ensure_default_image(self.config.images_root)
        self._image = load_image(image)
        self._image_root = image / "root"
        self.images.ensure()
        if self.base_builder is not None:
            self.base_builder.start()  # a thread: minutes on a cold store, and the API must come up meanwhile
        self._pool = self._storage_pool()
        if self._pool is not None:
            local = self.config.artifact_roots()["local"]
            referenced = {
                snap[0]
                for _, _, manifest in ckpt.list_artifacts(local, self.owner)
                if (snap := ckpt.snapshot_of(manifest)) is not None
            }
            for name in self._pool.sweep_snapshots(referenced):
                log.warning("removed an unreferenced checkpoint snapshot", extra={"snapshot": name})
        for root in self.config.artifact_roots().values():
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            # No capture of this daemon is in flight before it serves: its staging dirs are a crash's leftovers.
            for name in ckpt.sweep_partials(root, self.owner):
                log.warning("removed an interrupted checkpoint write", extra={"path": str(root / name)})
        for inside, host in self.config.ro_binds.items():
            if not host.is_dir():
                raise UnavailableError(f"ro_binds: host dir {host} for {inside} does not exist")
        runtime = self.config.execd_runtime
        if self.config.execd_runtime_dir is None:
            # Our own execd, from the same source as this daemon: byte-compiled once here, not per sandbox.
            install_runtime(runtime)
        elif not (runtime / "adx" / "execd" / "__main__.py").is_file():
            raise UnavailableError(f"execd_runtime_dir {runtime} holds no execd runtime (install_runtime)")
        self.spawner.execd_python = self._execd_python()
        self._decide_userns()
        self.capacity = measure_capacity(self.config)

    def _storage_pool(self) -> StoragePool | None:
        """``disk_quota``: 'off', 'btrfs' (refuse to start without a pool) or 'auto' (a pool where one mounts)."""
        mode = self.config.disk_quota
        if mode == "off":
            self._disk_quota_note = "disk_quota = 'off' in the configuration"
            return None
        image_file, mount = pool_paths(self.config.state_dir)
        pool = StoragePool(image_file, mount, self.config.storage_image_bytes)
        reason = pool_unsupported_reason() if mode == "auto" else None
        if reason is None:
            try:
                pool.ensure()  # adopts the mount an earlier run left
            except UnavailableError as exc:
                if mode == "btrfs":
                    raise
                reason = exc.message
        if reason is not None:
            self._disk_quota_note = reason
            log.warning("disk requests are not enforced (disk_quota = 'auto' found no btrfs pool): %s", reason)
            return None
        self._disk_quota_note = None
        return pool

    def _decide_userns(self) -> None:
        """``user_namespace``: 'off', 'on' (refuse to start without support) or 'auto' (on where supported)."""
        mode = self.config.user_namespace
        reason = unsupported_reason() if mode != "off" else "user_namespace = 'off' in the configuration"
        if reason is not None and mode == "on":
            raise UnavailableError(f"user_namespace = 'on' but {reason}")
        self._userns, self._userns_note = reason is None, reason
        if mode == "auto" and reason is not None:
            log.warning("sandboxes run without user namespaces (their root is host root): %s", reason)
        self.spawner.userns = self._userns

    def _under_image_binds(self, path: str) -> bool:
        """True when ``path`` inside a sandbox is the host's same path (a read-only bind of the image)."""
        return any(path == b or path.startswith(b + "/") for b in self.skeleton_binds)

    def _execd_python(self) -> str | None:
        """The host interpreter execd sandboxes exec by default, when PID 1 can run execd in process instead:
        our own execd runtime (the spawner imports the same modules from the same source), ``python3`` found
        under the image's host binds, and a version execd supports."""
        if not self.config.execd_in_process or self.config.execd_runtime_dir is not None:
            return None
        found = self._resolve_in_image(ExecdOptions().python, SANDBOX_PATH)
        if found is None:
            return None
        check = [found, "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]
        ok = subprocess.run(check, capture_output=True, check=False, timeout=30).returncode == 0
        return found if ok else None

    def _resolve_in_image(self, name: str, path: str) -> str | None:
        """The host path (resolved) of the executable a sandbox finds as ``name`` on ``path``, or None when that
        is not a file of the image's host binds (or depends on what the sandbox's own layers hold)."""
        if "/" in name:
            candidates = [name] if self._under_image_binds(name) else []
        else:
            candidates = []
            for d in path.split(":"):
                if not self._under_image_binds(d):
                    break  # the sandbox's own dirs come first from here: what they hold is not ours to know
                candidates.append(f"{d}/{name}")
        for candidate in candidates:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                real = os.path.realpath(candidate)
                return real if self._under_image_binds(real) else None
        return None

    def _cgroup_parents(self) -> list[Path]:
        return [r / self.config.cgroup_parent for r in self.layout.roots]
