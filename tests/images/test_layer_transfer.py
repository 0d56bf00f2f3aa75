"""A store layer as a byte stream and back (``adx.images._transfer``, issue 13): what overlayfs needs of a layer
survives the trip (owners, modes, setuid, whiteouts, opaque dirs, file capabilities, links), a stream that does
not match what its sender hashed is refused, and nothing of a refused or killed transfer stays under a digest."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from adx.errors import InvalidInputError, UnavailableError
from adx.images import ImageStore, LayerInfo, layer_digest
from adx.images._transfer import LayerReceiver, layer_stream, remove_dead_pull_staging


def _rich_layer(store: ImageStore) -> str:
    digest = layer_digest(None, "RUN rich")
    staging = store.staging()
    tree = staging / "tree"
    (tree / "usr/bin").mkdir(parents=True)
    tool = tree / "usr/bin/tool"
    tool.write_bytes(os.urandom(300_000))  # more than one tar block, random: any bit flip is seen
    os.chmod(tool, 0o4755)
    os.chown(tool, 0, 0)
    owned = tree / "home/user/notes.txt"
    owned.parent.mkdir(parents=True)
    owned.write_text("mine\n")
    os.chown(owned, 1000, 1000)
    os.chown(owned.parent, 1000, 1000)
    os.mknod(tree / "deleted", 0o600 | 0o020000, os.makedev(0, 0))  # an overlay whiteout
    (tree / "opaque").mkdir()
    os.setxattr(tree / "opaque", "trusted.overlay.opaque", b"y")
    os.setxattr(tool, "security.capability", _CAP_NET_RAW)
    (tree / "usr/bin/link").symlink_to("tool")
    os.link(tool, tree / "usr/bin/hard")
    store.commit_layer(staging, digest, None, "RUN rich")
    return digest


# A version-2 file capability granting cap_net_raw (what `setcap cap_net_raw+ep` writes), little-endian words.
_CAP_NET_RAW = (0x02000001).to_bytes(4, "little") + (1 << 13).to_bytes(4, "little") + bytes(12)


def _describe(root: Path) -> dict[str, tuple[object, ...]]:
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(dirpath) / name
            st = os.lstat(path)
            xattrs = {} if path.is_symlink() else {k: os.getxattr(path, k) for k in os.listxattr(path)}
            content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else ""
            out[str(path.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, st.st_rdev, xattrs, content)
    return out


async def _send(src: ImageStore, dst: ImageStore, digest: str, corrupt_at: int | None = None) -> LayerInfo:
    receiver = await LayerReceiver(dst, src.layer_info(digest)).open()
    h = hashlib.sha256()
    size = 0
    try:
        async for chunk in layer_stream(src, digest):
            h.update(chunk)
            size += len(chunk)
            if corrupt_at is not None and size > corrupt_at >= size - len(chunk):
                i = corrupt_at - (size - len(chunk))
                chunk = chunk[:i] + bytes([chunk[i] ^ 0x01]) + chunk[i + 1 :]
            await receiver.feed(chunk)
        return await receiver.finish(h.hexdigest(), size, "src")
    except BaseException:
        await receiver.abort()
        raise


async def test_a_layer_arrives_with_owners_modes_whiteouts_xattrs_and_links(tmp_path: Path) -> None:
    src, dst = ImageStore(tmp_path / "a").ensure(), ImageStore(tmp_path / "b").ensure()
    digest = _rich_layer(src)
    info = await _send(src, dst, digest)
    assert info.digest == digest and dst.has_layer(digest) and dst.layer_info(digest).step == "RUN rich"
    assert _describe(dst.layer_tree(digest)) == _describe(src.layer_tree(digest))
    assert (
        os.stat(dst.layer_tree(digest) / "usr/bin/hard").st_ino
        == os.stat(dst.layer_tree(digest) / "usr/bin/tool").st_ino
    )
    assert not [p for p in dst.layers_dir.iterdir() if p.name.startswith(".tmp-")]


async def test_a_stream_changed_in_transit_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    src, dst = ImageStore(tmp_path / "a").ensure(), ImageStore(tmp_path / "b").ensure()
    digest = _rich_layer(src)
    # A byte inside the random file's data: tar itself cannot notice (no content checksum); the digest does.
    with pytest.raises(UnavailableError) as refused:
        await _send(src, dst, digest, corrupt_at=200_000)
    assert refused.value.details["layer"] == digest and "refused" in refused.value.message
    assert not dst.has_layer(digest)
    assert sorted(p.name for p in dst.layers_dir.iterdir()) == []  # no layer, no staging


def test_staging_of_a_killed_pull_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    store = ImageStore(tmp_path).ensure()
    dead = subprocess.Popen(["true"])
    dead.wait()
    killed = store.staging(f"pull-{dead.pid}-")
    live = store.staging(f"pull-{os.getpid()}-")
    build = store.staging()
    assert remove_dead_pull_staging(store) == [killed.name]
    assert live.exists() and build.exists() and not killed.exists()


async def test_a_digest_that_is_not_one_never_becomes_a_path(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store").ensure()
    (tmp_path / "outside" / "tree").mkdir(parents=True)
    (tmp_path / "outside" / "layer.json").write_text("{}")  # what a traversal would find
    with pytest.raises(InvalidInputError) as refused:
        async for _ in layer_stream(store, "../../outside"):
            pass
    assert refused.value.field == "digest"
    with pytest.raises(InvalidInputError) as refused:
        LayerReceiver(store, LayerInfo(digest="../escape", step="x"))
    assert refused.value.field == "layer.digest"
