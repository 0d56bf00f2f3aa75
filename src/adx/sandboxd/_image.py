"""The default sandbox image: a Debian userland with the host's Python 3, built once per node.

The image directory is the read-only overlay *lower* layer every sandbox shares. It holds a skeleton root
(mount points, ``/work``, ``/tmp``, a filtered copy of ``/etc``) and records which host directories are
bind-mounted read-only on top at start (``/usr`` and, on non-merged-/usr hosts, ``/bin``, ``/lib``, ...).
Never copied or bound: ``/root``, ``/home``, ``/etc/shadow`` and other non-world-readable files, SSH/TLS
private keys, the ADX state directory, other sandboxes' layers.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from adx._fs import atomic_write_json, fsync_dir

__all__ = ["IMAGE_FORMAT", "ensure_default_image", "load_image"]

IMAGE_FORMAT = 1

# /etc entries copied into the image (world-readable files only; secrets such as shadow never are).
_ETC_ALLOW = (
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "resolv.conf",
    "nsswitch.conf",
    "gai.conf",
    "ld.so.conf",
    "ld.so.conf.d",
    "ld.so.cache",
    "os-release",
    "debian_version",
    "issue",
    "localtime",
    "timezone",
    "mime.types",
    "protocols",
    "services",
    "networks",
    "ethertypes",
    "profile",
    "profile.d",
    "bash.bashrc",
    "environment",
    "inputrc",
    "shells",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
    "skel",
    "magic",
    "magic.mime",
    "locale.alias",
)
_ETC_DENY_NAMES = frozenset({"private", "shadow", "gshadow", "shadow-", "gshadow-", "sudoers", "ssh"})
_TOP_DIRS = ("usr", "proc", "dev", "tmp", "work", "run", "run/adx", "home", "opt", "mnt", "srv", "var", "var/tmp")
_HOST_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _copy_filtered(src: Path, dst: Path) -> None:
    if src.name in _ETC_DENY_NAMES:
        return
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
        return
    try:
        st = src.stat()
    except OSError:
        return
    if src.is_dir():
        dst.mkdir(mode=st.st_mode & 0o7777)
        for child in sorted(src.iterdir()):
            _copy_filtered(child, dst / child.name)
        return
    if not src.is_file() or not st.st_mode & 0o004:
        return  # not world-readable: treat as a secret
    shutil.copy2(src, dst)


def _build(root: Path, host_root: Path) -> dict[str, Any]:
    binds: list[str] = ["/usr"]
    for name in _TOP_DIRS:
        (root / name).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    os.chmod(root / "var/tmp", 0o1777)
    (root / "root").mkdir(mode=0o700)
    for name in _HOST_DIRS:
        host = host_root / name
        if host.is_symlink():
            os.symlink(os.readlink(host), root / name)
        elif host.is_dir():
            (root / name).mkdir()
            binds.append(f"/{name}")
    etc = root / "etc"
    etc.mkdir()
    for name in _ETC_ALLOW:
        src = host_root / "etc" / name
        if src.exists() or src.is_symlink():
            if name == "resolv.conf" and src.is_symlink():
                # Often points into /run, which the sandbox does not share: copy the content.
                shutil.copy(src, etc / name)
            else:
                _copy_filtered(src, etc / name)
    (etc / "hostname").write_text("sandbox\n")
    (etc / "mtab").symlink_to("/proc/self/mounts")
    return {"format": IMAGE_FORMAT, "name": "default", "binds": binds}


def ensure_default_image(images_dir: Path, host_root: Path = Path("/")) -> Path:
    """Build ``images_dir/default`` once (crash-safe: build in a temp dir, rename into place)."""
    target = images_dir / "default"
    if (target / "image.json").exists():
        return target
    images_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=".default-", dir=images_dir))
    try:
        (staging / "root").mkdir(mode=0o755)
        meta = _build(staging / "root", host_root)
        atomic_write_json(staging / "image.json", meta, mode=0o644)
        os.rename(staging, target)
        fsync_dir(images_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def load_image(path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((path / "image.json").read_text())
    if meta.get("format") != IMAGE_FORMAT:
        raise ValueError(f"image {path}: unsupported format {meta.get('format')!r}")
    return meta
