"""The Debian base image: a bookworm userland made by ``mmdebstrap`` from Debian's packages, one layer.

What is in it (E2B's base has the same): python3 and ``python`` (python-is-python3), pip, node and npm/npx,
git, curl, sudo, ca-certificates, a ``user`` account (uid/gid 1000, ``/home/user``, bash, passwordless sudo), and
the directories sandboxd mounts on (``/work``, ``/run/adx``, ``/opt/adx``). The manifest runs as ``user`` in
``/home/user``. Nothing of the host is in it.

node is not Debian's ``nodejs``: that one links libnode, ICU, OpenSSL and libuv dynamically (24-26 ms of CPU per
``node -v``, docs/performance.md) and its ``npm`` brings hundreds of ``node-*`` packages. It is upstream's
self-contained build and npm from the npm registry, pinned by version and sha512 (images/_node_dist.py),
unpacked into ``/usr/local`` (so ``sudo npm install -g`` installs there too).

The layer's digest covers the suite, the package list, the node and npm pins and this recipe's version: the same
request is built once per store and then found there ("cached"). A cold build took 58-88 s on the dev machine
(2 CPUs, load 6-28; Debian's nodejs/npm recipe: 112-186 s) and makes a 540 MB tree (149 packages).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable

from adx.errors import UnavailableError
from adx.images._node_dist import DEFAULT_NPM_REGISTRY, NODE, NPM, fetch_tarball, install_node
from adx.images._store import ImageManifest, ImageStore, layer_digest

__all__ = ["DEBIAN_PACKAGES", "TYPICAL_BUILD_SECONDS", "ensure_debian_image"]

DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = (
    "python3",
    "python-is-python3",
    "python3-pip",
    "python3-venv",
    # node's one dynamic dependency besides libc (minbase has it through apt; named so it stays).
    "libstdc++6",
    "git",
    "curl",
    "sudo",
    "ca-certificates",
    "procps",
    # Resolves the sandbox's own hostname (its ID) without an /etc/hosts entry: sudo looks it up every time.
    "libnss-myhostname",
)
#: Bumped whenever the hooks below change what the tree holds (the digest then changes: a rebuild).
_RECIPE = 3
#: Shown to the user before a cold build (58-88 s measured on the dev machine at load 6-28, docs/images.md; up to
#: twice that on a slow mirror).
TYPICAL_BUILD_SECONDS = 120

_HOOKS = (
    'chroot "$1" groupadd --gid 1000 user',
    'chroot "$1" useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash user',
    'echo "user ALL=(ALL:ALL) NOPASSWD: ALL" > "$1/etc/sudoers.d/user" && chmod 0440 "$1/etc/sudoers.d/user"',
    'mkdir -p "$1/work" "$1/run/adx" "$1/opt/adx" && chmod 1777 "$1/tmp" "$1/var/tmp"',
    'echo sandbox > "$1/etc/hostname"',
    # mmdebstrap leaves the host's resolver in; the sandbox's network decides its own.
    'printf "nameserver 1.1.1.1\\n" > "$1/etc/resolv.conf"',
    'rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*_Packages',
)


def _step_text(suite: str, packages: tuple[str, ...]) -> str:
    return (
        f"mmdebstrap recipe={_RECIPE} variant=minbase suite={suite} include={','.join(sorted(packages))} "
        f"node={NODE.pin} npm={NPM.pin}"
    )


def ensure_debian_image(
    store: ImageStore,
    name: str = "debian",
    *,
    suite: str = DEBIAN_SUITE,
    packages: tuple[str, ...] = DEBIAN_PACKAGES,
    mirror: str | None = None,
    npm_registry: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[ImageManifest, bool]:
    """Image ``name`` from Debian's packages: built when its layer is not in the store yet. Returns the
    manifest and whether a build ran (False: cached).

    ``mirror``: the Debian mirror (mmdebstrap's default when None). ``npm_registry``: where node and npm are
    fetched (else ``ADX_NPM_REGISTRY``, else the public registry); neither is in the digest: the pins are."""
    say = progress or (lambda _line: None)
    step = _step_text(suite, packages)
    digest = layer_digest(None, step)
    manifest = ImageManifest(
        name=name,
        layers=[digest],
        env={"HOME": "/home/user", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        workdir="/home/user",
        user="user",
        created_at=time.time(),
        history=[step],
    )
    existing = store.find(name)
    if store.has_layer(digest):
        if existing is None or existing.layers != [digest]:
            store.put(manifest)
        return store.get(name), False
    if shutil.which("mmdebstrap") is None:
        raise UnavailableError("building the Debian base image needs mmdebstrap (apt-get install mmdebstrap)")
    registry = npm_registry or os.environ.get("ADX_NPM_REGISTRY") or DEFAULT_NPM_REGISTRY
    downloads = store.root / "downloads"
    say(f"fetching node {NODE.version} and npm {NPM.version} from {registry}")
    # First: an unreachable registry or a wrong tarball fails the build before minutes of mmdebstrap.
    node_tgz = fetch_tarball(NODE, registry, downloads, say)
    npm_tgz = fetch_tarball(NPM, registry, downloads, say)
    staging = store.staging()
    tree = staging / "tree"
    tree.rmdir()  # mmdebstrap wants to create (or find empty) its target
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=directory",
        f"--include={','.join(packages)}",
        *(f"--customize-hook={hook}" for hook in _HOOKS),
        suite,
        str(tree),
        *([mirror] if mirror else []),
    ]
    say(f"building image {name} from Debian {suite} with mmdebstrap (usually ~{TYPICAL_BUILD_SECONDS}s)")
    t0 = time.monotonic()
    try:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            tail: list[str] = []
            for line in proc.stdout:
                line = line.rstrip()
                tail = [*tail[-19:], line]
                if line.startswith(("I:", "E:", "W:")):
                    say(f"[{time.monotonic() - t0:5.0f}s] {line}")
        if proc.returncode != 0:
            raise UnavailableError(f"mmdebstrap failed ({proc.returncode}):\n" + "\n".join(tail))
        say(f"[{time.monotonic() - t0:5.0f}s] installing node {NODE.version} and npm {NPM.version} into /usr/local")
        install_node(node_tgz, npm_tgz, tree)
        store.commit_layer(staging, digest, None, step)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    store.put(manifest)
    say(f"image {name} built in {time.monotonic() - t0:.0f}s")
    return store.get(name), True
