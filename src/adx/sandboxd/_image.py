"""The default sandbox image: a Debian userland with the host's Python 3, built once per node.

The image directory is the read-only overlay *lower* layer every sandbox shares. It holds a skeleton root
(mount points, ``/work``, ``/tmp``, a filtered copy of ``/etc``) and records which host directories are
bind-mounted read-only on top at start (``/usr`` and, on non-merged-/usr hosts, ``/bin``, ``/lib``, ...).
Never copied or bound: ``/root``, ``/home``, ``/etc/shadow`` and other non-world-readable files, SSH/TLS
private keys, the ADX state directory, other sandboxes' layers.

E2B's ``user`` account (uid/gid 1000, ``/home/user`` with ``/etc/skel``'s files, bash) is part of the skeleton:
E2B programs run every command as it, and making it in each sandbox at its first command (execd's fallback for
images without it, ``adx.execd._accounts``) cost that command tens of milliseconds (issue 14).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TypedDict

from adx._fs import atomic_write_json, fsync_dir

__all__ = ["IMAGE_FORMAT", "ImageMeta", "ensure_default_image", "load_image"]

IMAGE_FORMAT = 1
#: What the skeleton holds, in ``image.json``: a node whose image is older is given a new one (2: E2B's ``user``).
SKELETON_VERSION = 2
#: E2B's account, made in the skeleton (the same name and ids as ``adx.execd._accounts`` makes on first use).
E2B_USER = "user"
E2B_ID = 1000

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


class ImageMeta(TypedDict):
    """The host-derived skeleton's ``image.json``."""

    format: int  # IMAGE_FORMAT
    name: str
    binds: list[str]  # host dirs the skeleton binds read-only at the same path
    skeleton: int  # SKELETON_VERSION it was built by (an older one is rebuilt)


def _build(root: Path, host_root: Path) -> ImageMeta:
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
    _add_e2b_user(root)
    _profile_without_id_process(etc / "profile")
    return {"format": IMAGE_FORMAT, "name": "default", "binds": binds, "skeleton": SKELETON_VERSION}


#: Debian's /etc/profile asks ``"$(id -u)"`` (twice): a fork and an exec of ``id`` in every login shell, and E2B
#: runs every command through ``bash -l`` (measured in a sandbox on a loaded 2-core machine: bash -l -c true 22.9
#: ms, of which id's process ~10 ms). bash and ksh know the answer (``EUID``); other shells still run ``id``.
_ID_U = '"$(id -u)"'
_EUID_OR_ID_U = '"${EUID:-$(id -u)}"'


def _profile_without_id_process(profile: Path) -> None:
    """The skeleton's copy of the host's ``/etc/profile`` with ``"$(id -u)"`` read from ``EUID`` where the shell
    has it: the same value, without a process."""
    if profile.is_symlink() or not profile.is_file():
        return
    text = profile.read_text(encoding="utf-8", errors="surrogateescape")
    if _ID_U in text:
        profile.write_text(text.replace(_ID_U, _EUID_OR_ID_U), encoding="utf-8", errors="surrogateescape")


def _without(path: Path, name: str, number: int) -> list[str]:
    """``path``'s lines (passwd or group) but the entry named ``name`` and the one whose id (third field) is
    ``number``: the host's account at uid 1000 has no home in a sandbox (``/home`` is never copied), so it gives
    the id up to E2B's ``user``, as execd's fallback does."""
    lines = path.read_text(encoding="utf-8", errors="surrogateescape").splitlines() if path.exists() else []
    kept = []
    for line in lines:
        fields = line.split(":")
        if line.strip() and not (fields[0] == name or (len(fields) > 2 and fields[2] == str(number))):
            kept.append(line)
    return kept


def _add_e2b_user(root: Path) -> None:
    """E2B's ``user`` in the skeleton's passwd and group, and its home (``/etc/skel``'s files, owned by it).
    No shadow entry: the image has no ``/etc/shadow`` (a host secret), and the account needs no password."""
    etc, home = root / "etc", root / "home" / E2B_USER
    shell = "/bin/bash"  # the host's /usr is the sandbox's, and E2B runs commands through bash -l
    for file, entry in (
        ("passwd", f"{E2B_USER}:x:{E2B_ID}:{E2B_ID}::/home/{E2B_USER}:{shell}"),
        ("group", f"{E2B_USER}:x:{E2B_ID}:"),
    ):
        lines = [*_without(etc / file, E2B_USER, E2B_ID), entry]
        (etc / file).write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
        os.chmod(etc / file, 0o644)
    home.mkdir(mode=0o755)
    if (etc / "skel").is_dir():
        shutil.copytree(etc / "skel", home, dirs_exist_ok=True, symlinks=True)
    for path in (home, *home.rglob("*")):
        os.lchown(path, E2B_ID, E2B_ID)


def ensure_default_image(images_dir: Path, host_root: Path = Path("/")) -> Path:
    """Build ``images_dir/default`` once (crash-safe: build in a temp dir, rename into place).

    An image of an older skeleton is replaced by a new one: the old directory is renamed aside
    (``.default-skeleton-N``) and kept, since sandboxes that run on it hold it as their lower layer (it is small:
    a copy of ``/etc``); sandboxes started from then on get the new one."""
    target = images_dir / "default"
    if (target / "image.json").exists():
        if _skeleton_of(target) >= SKELETON_VERSION:
            return target
        stale: Path | None = target
    else:
        stale = None
    images_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=".default-", dir=images_dir))
    try:
        (staging / "root").mkdir(mode=0o755)
        meta = _build(staging / "root", host_root)
        atomic_write_json(staging / "image.json", meta, mode=0o644)
        if stale is not None:
            aside = Path(tempfile.mkdtemp(prefix=f".default-skeleton-{_skeleton_of(stale)}-", dir=images_dir))
            os.rename(stale, aside / "default")
        os.rename(staging, target)
        fsync_dir(images_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _skeleton_of(image: Path) -> int:
    try:
        version = json.loads((image / "image.json").read_text()).get("skeleton", 1)
    except (OSError, ValueError):
        return 0
    return version if isinstance(version, int) else 0


def load_image(path: Path) -> ImageMeta:
    meta: ImageMeta = json.loads((path / "image.json").read_text())  # written by _build; its format is checked
    if meta.get("format") != IMAGE_FORMAT:
        raise ValueError(f"image {path}: unsupported format {meta.get('format')!r}")
    return meta
